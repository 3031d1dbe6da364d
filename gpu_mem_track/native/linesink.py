"""The runner's native line sink (``line_sink``): loaded here, used by ``runner.profiler``.

``line_sink.cpp`` does ``LineProfiler``'s common path (a line event: statement mapping,
memory read, aggregates, timeline row) in C++ on the profiler's own Python objects, and
hands every rare case back to the profiler's Python code, so a run gives the same records
and timeline either way (``tests/test_line_sink.py`` compares them). It links no torch
library; the build key follows the torch in use, as the other modules' do.

Used when built, ``GPU_MEM_TRACK_NATIVE`` is not ``off`` and it loads (built for this
torch and Python). A run picks its path once, when it starts (:func:`for_run`): the
module when it is there; else the Python path for the whole run, and, when the module is
simply not built yet, a build in the background (:func:`request_build`: a process of its
own at low priority, a few seconds of one core), so that the runs after it are native.
``make native`` (``python -m gpu_mem_track.native.build``) builds it beforehand.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

from . import build_running, load_once, load_planned, request_background, start_build

__all__ = ["building", "for_run", "module", "request_build", "status"]

#: The ABI number of line_sink.cpp this Python code speaks.
ABI = 2

_lock = threading.Lock()


def _fresh_state() -> dict[str, Any]:
    note = "not looked for yet"
    return {"module": None, "looked": False, "note": note, "requested": False, "builder": None}


_state = _fresh_state()


def module() -> ModuleType | None:
    """The loaded ``line_sink`` module, or None (off, not built, being built, or not
    loadable; :func:`status` says which). Never builds; looks for the file once, and once
    more after a build this process started (or found running in another) has ended."""
    return load_once(_state, _lock, _load, building)


def _load() -> tuple[ModuleType | None, str]:
    return load_planned("line_sink", ABI, "in use: loaded from {path}")


def request_build() -> bool:
    """Start building the module in the background (once per process, never with
    ``GPU_MEM_TRACK_NATIVE=off``, nor when it is built, failed before or cannot be built
    here: no compiler, no headers). True when a build was started."""
    return request_background(_state, _lock, lambda: start_build("line_sink"))


def building() -> bool:
    """Whether a build this process started is still running, or, after one was started,
    another process holds the build's lock."""
    return build_running(_state, "line_sink")


def for_run() -> tuple[ModuleType | None, str]:
    """The line sink a run starting now uses, and :func:`status`'s line on it (the run
    says both): the module, or None for the Python path (off, being built, not built and
    why, or why it did not load). A module that is not built yet is built in the
    background for the next runs (:func:`request_build`; nothing is started where it
    cannot be built, nor after a failed build)."""
    found = module()
    if found is None:
        request_build()
    return found, status()


def status() -> str:
    """One line: whether the native line sink is in use, and why not."""
    module()
    return str(_state["note"])
