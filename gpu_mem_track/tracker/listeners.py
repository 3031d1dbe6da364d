"""Stamp listeners: the public hook for following every ``MemTracker`` in the process.

A listener registered with :func:`add_stamp_listener` is called after each stamp any
tracker writes (``on_stamp(tracker, stamp)``, the stamp a ``records.Stamp``), and its
``folder`` (when not None) is where trackers created meanwhile with the default output
folder (``reports``) write their reports. The line runner registers one while a script
runs, so the script's trackers write into the run folder and their stamps become the
run's ``track`` timeline rows. Torch-free; listeners are called in registration order,
on the thread that stamped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "StampListener",
    "add_stamp_listener",
    "listening",
    "notify",
    "redirected_folder",
    "remove_stamp_listener",
]


class StampListener(Protocol):
    #: Where trackers made with the default output folder write while this listens (None:
    #: leave them alone).
    folder: Path | None

    def on_stamp(self, tracker: Any, stamp: Any) -> None:
        """Called after ``tracker`` wrote ``stamp``; must not raise."""


_listeners: list[StampListener] = []


def add_stamp_listener(listener: StampListener) -> None:
    """Call ``listener.on_stamp`` after every stamp from now on (once, however often added)."""
    if not any(known is listener for known in _listeners):
        _listeners.append(listener)


def remove_stamp_listener(listener: StampListener) -> None:
    """Stop calling ``listener`` (nothing happens when it was not registered)."""
    _listeners[:] = [known for known in _listeners if known is not listener]


@contextmanager
def listening(listener: StampListener) -> Iterator[StampListener]:
    """``add_stamp_listener`` for the duration of a ``with`` block."""
    add_stamp_listener(listener)
    try:
        yield listener
    finally:
        remove_stamp_listener(listener)


def redirected_folder() -> Path | None:
    """The folder of the latest registered listener that names one (None: no redirection)."""
    for listener in reversed(_listeners):
        if listener.folder is not None:
            return Path(listener.folder)
    return None


def notify(tracker: Any, stamp: Any) -> None:
    """Tell every listener that ``tracker`` wrote ``stamp`` (called by ``MemTracker``)."""
    for listener in tuple(_listeners):
        listener.on_stamp(tracker, stamp)
