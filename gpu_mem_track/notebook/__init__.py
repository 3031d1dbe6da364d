"""Notebooks: ``%load_ext gpu_mem_track`` registers ``%memtrack`` (one statement: what
it allocated, its peak, the tensor groups it created or freed) and ``%%memtrack`` (a cell,
line by line, with ``run``'s census options). Needs IPython (the ``notebook`` extra).

``measure``: the measuring; ``records``: its results; ``render``: them as text (their HTML
is in ``html.tables``); ``magics``: the IPython side.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics with ``ipython`` (an ``InteractiveShell``)."""
    from .magics import MemtrackMagics

    ipython.register_magics(MemtrackMagics)


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo: the magics hold no hooks between calls."""
