"""The tracker: ``MemTracker().track()`` stamps, the live-tensor census and its reports.

Measuring: ``census`` (live tensors), ``saved`` (tensors saved for backward),
``naming``, ``readers`` (allocator and driver), ``probe`` (the CUDA context).
Data: ``records``. Rendering and files: ``render``, ``csvlog``. Entry: ``memtracker``.
Importing this package imports no torch; ``MemTracker`` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .memtracker import MemTracker

__all__ = ["MemTracker"]


def __getattr__(name: str) -> Any:
    if name == "MemTracker":
        from .memtracker import MemTracker

        return MemTracker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
