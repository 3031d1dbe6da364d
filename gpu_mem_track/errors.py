"""Errors raised for user mistakes; the CLI prints their message and exits 2."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A bad argument or an unusable path; the message names the problem."""
