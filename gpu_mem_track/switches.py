"""The package's on/off environment variables (``GPU_MEM_TRACK_NATIVE``,
``GPU_MEM_TRACK_FORKSERVER``, ``GPU_MEM_TRACK_META_CACHE``, ``GPU_MEM_TRACK_SAVED_PROBE``),
read one way: ``off``, ``0``, ``no`` or ``false`` in any case, with spaces around, turns
one off; anything else, or unset, leaves it on. Imports nothing of the package."""

from __future__ import annotations

import os

__all__ = ["switched_off"]

_OFF = ("off", "0", "no", "false")


def switched_off(name: str) -> bool:
    """Whether the environment variable ``name`` turns its feature off."""
    return os.environ.get(name, "").strip().lower() in _OFF
