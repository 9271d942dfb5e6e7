"""What the CLIs share (`python -m strata.accel`, `strata.reference`, `strata.synth`, `sim`): checked values (a value
out of its range is a usage error naming the flag, before any model loads), text in and out as UTF-8 whatever the
locale, and a quiet end when the reader of stdout goes away."""

from __future__ import annotations

import argparse
import codecs
import os
import sys


def checked(kind, flag: str, ok, what: str):
    """An argparse type: `kind(text)` where ok(value) holds, else a usage error naming the flag and the range
    (`what`), before any model is loaded."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes {'an integer' if kind is int else 'a number'}, "
                                             f"not {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"{flag} must be {what}, got {text}")
        return v
    return parse


def text(flag: str):
    """An argparse type for text the model reads (a prompt): the bytes the shell passed, read as UTF-8. Under an
    ASCII locale (LANG unset or C, as in many containers) Python decodes argv as ASCII with surrogate escapes, which
    no tokenizer can encode; bytes that are not UTF-8 are a usage error naming the flag."""
    def parse(arg: str) -> str:
        try:
            return os.fsencode(arg).decode("utf-8")
        except UnicodeDecodeError:
            raise argparse.ArgumentTypeError(f"{flag} is not UTF-8 text") from None
    return parse


def utf8_output() -> None:
    """Generated text goes out as UTF-8 whatever the locale: under an ASCII one, printing a token outside ASCII
    would raise mid-generation."""
    for stream in (sys.stdout, sys.stderr):
        enc = getattr(stream, "encoding", None) or "ascii"
        if codecs.lookup(enc).name != "utf-8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="utf-8", errors="backslashreplace")


def closed_stdout() -> int:
    """The reader of our output went away (`generate ... | head`): stop generating, without a traceback, and point
    stdout at /dev/null so that the interpreter's own flush at exit does not raise again. 141 = 128 + SIGPIPE, what
    a shell reports for a writer its pipe's reader left."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141
