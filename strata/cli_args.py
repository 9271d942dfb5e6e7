"""Checked command-line values shared by the CLIs (`python -m strata.accel`, `strata.reference`, `sim`): a value out
of its range is a usage error naming the flag, before any model loads."""

from __future__ import annotations

import argparse


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
