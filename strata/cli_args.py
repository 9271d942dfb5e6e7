"""What the CLIs share (`python -m strata.accel`, `strata.reference`, `strata.synth`, `sim`): checked values (a value
out of its range is a usage error naming the flag, before any model loads) and a quiet end when the reader of
stdout goes away."""

from __future__ import annotations

import argparse
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


def closed_stdout() -> int:
    """The reader of our output went away (`generate ... | head`): stop generating, without a traceback, and point
    stdout at /dev/null so that the interpreter's own flush at exit does not raise again. 141 = 128 + SIGPIPE, what
    a shell reports for a writer its pipe's reader left."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141
