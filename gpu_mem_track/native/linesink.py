"""The runner's native line sink (``line_sink``): loaded here, used by ``runner.profiler``.

``line_sink.cpp`` does ``LineProfiler``'s common path (a line event: statement mapping,
memory read, aggregates, timeline row) in C++ on the profiler's own Python objects, and
hands every rare case back to the profiler's Python code, so a run gives the same records
and timeline either way (``tests/test_line_sink.py`` compares them). It links no torch
library; the build key follows the torch in use, as the other modules' do.

Used when built, ``GPU_MEM_TRACK_NATIVE`` is not ``off`` and it loads (built for this
torch and Python). ``make native`` (``python -m gpu_mem_track.native.build``) builds it,
as does ``make gpu-check`` before it times the runner; nothing builds it automatically.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

from . import load_once, load_planned

__all__ = ["module", "status"]

#: The ABI number of line_sink.cpp this Python code speaks.
ABI = 1

_lock = threading.Lock()
_state: dict[str, Any] = {"module": None, "looked": False, "note": "not looked for yet"}


def module() -> ModuleType | None:
    """The loaded ``line_sink`` module, or None (off, not built, or not loadable;
    :func:`status` says which). Looks for the file once per process; never builds."""
    return load_once(_state, _lock, _load)


def _load() -> tuple[ModuleType | None, str]:
    return load_planned("line_sink", ABI, "in use: loaded from {path}")


def status() -> str:
    """One line: whether the native line sink is in use, and why not."""
    module()
    return str(_state["note"])
