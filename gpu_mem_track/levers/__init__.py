"""Levers: changes to a training script that can lower its GPU memory, applied by
``run --lever NAME`` without editing the script.

``LEVERS`` names them, cheapest first; ``describe(name)`` gives a lever's cost in words,
its rank and its generic change; ``applied_levers`` puts them in force around a run
(``apply``); each run records a ``LeverReport`` per lever in its ``meta.json``, which
``read_levers(run_folder)`` reads back. Importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .catalog import LEVERS, LeverInfo, check_levers, describe
from .records import LeverReport, read_levers

if TYPE_CHECKING:
    from .apply import AppliedLevers, applied_levers

__all__ = [
    "LEVERS",
    "AppliedLevers",
    "LeverInfo",
    "LeverReport",
    "applied_levers",
    "check_levers",
    "describe",
    "read_levers",
]


def __getattr__(name: str) -> Any:
    if name in ("AppliedLevers", "applied_levers"):
        from . import apply

        return getattr(apply, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
