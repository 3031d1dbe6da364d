"""Errors raised for user mistakes; the CLI prints their message and exits 2."""

from __future__ import annotations

__all__ = ["BadInput", "TooLarge", "UsageError"]


class UsageError(ValueError):
    """A bad argument or an unusable path; the message names the problem."""


class BadInput(UsageError):
    """A file given to us is not what it should be (not a snapshot, a report or a run
    description; too large, too deep, malformed): the one error of every guarded reader
    (``inputs``, ``csvrows``, ``snapshots.load``). Its message is one line naming the file
    and the problem; the CLI exits 2 as for any ``UsageError``."""


class TooLarge(BadInput):
    """A file over a guarded reader's bound of bytes, on disk or once gunzipped
    (``inputs.read_bytes``, ``inputs.gunzip``): a caller that lets the bound be set can
    say how."""
