"""Stamps printed beside a framework's progress bars.

The Hugging Face Trainer and Lightning draw ``tqdm`` bars on stderr, ending each redraw
with a carriage return and no newline; a stamp written to stdout then starts on the bar's
line. ``BesideProgressBars`` writes each stamp through ``tqdm``'s own
``external_write_mode``, which clears the bars, lets the text through, and redraws them
below it, so every stamp starts on a fresh line. Without ``tqdm`` imported (no bars can
exist) it writes straight through; it never imports ``tqdm`` itself.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, TextIO

__all__ = ["BesideProgressBars"]


class BesideProgressBars:
    """A text stream writing to ``target`` (default: ``sys.stdout`` at each write, so a
    redirection made later is followed) without mixing its lines into ``tqdm`` bars."""

    def __init__(self, target: TextIO | None = None) -> None:
        self._target = target

    @property
    def target(self) -> TextIO:
        return self._target if self._target is not None else sys.stdout

    def write(self, text: str) -> int:
        target = self.target
        with _bars_cleared(target):
            written = target.write(text)
            target.flush()
        return written

    def flush(self) -> None:
        self.target.flush()


def _bars_cleared(target: TextIO) -> Any:
    """``tqdm``'s context that clears its live bars sharing a terminal with ``target``
    and redraws them after (a null context when ``tqdm`` was never imported)."""
    module = sys.modules.get("tqdm")
    bar = getattr(module, "tqdm", None)
    external = getattr(bar, "external_write_mode", None)
    if external is None or not getattr(bar, "_instances", None):
        return contextlib.nullcontext()
    return external(file=target)
