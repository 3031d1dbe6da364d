"""The runner's read of the CUDA allocator's statistics without torch's dict (``cuda_stats``).

``torch._C._cuda_memoryStats(index)`` builds the caching allocator's whole statistics as a
nested dict of about 200 entries: 11.4 us a call on an H200, paid after every line the
runner traces, to read five figures. The native module ``cuda_stats`` (``cuda_stats.cpp``)
makes the same C++ call on the same allocator and returns only those five:
``(allocated, allocated_peak, reserved, reserved_peak, events)``, bytes of the ``all``
pool and the allocations plus frees counted (see :func:`figures`).

When it is used (``runner.samplers.CudaSampler``): once the program has started CUDA,
when this torch is a CUDA build, the module is built for it, ``GPU_MEM_TRACK_NATIVE`` is
not ``off``, and :func:`checked_read` found it reading exactly what the dict says on that
device (one comparison, with a real GPU only, made once the device has allocated
something: without a GPU torch has no allocator to read, so the module loads but is
never checked nor used). Otherwise the sampler reads
the dict, as before. The module is built by ``make native``, or in the background when a
CUDA run finds it missing (:func:`request_build`, a few seconds of one core): that run
reads the dict until the build has ended, and the reader from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import build_running, load_once, load_planned, request_background, start_build

__all__ = ["awaiting", "building", "checked_read", "figures", "module", "request_build", "status"]

#: The ABI number of cuda_stats.cpp this Python code speaks.
ABI = 1
#: How many times :func:`checked_read` compares before giving up on a moving allocator.
CHECK_TRIES = 5

Read = Callable[[int], tuple[int, int, int, int, int]]

_lock = threading.Lock()
#: What :func:`_compare` says when the allocator's figures are all zero: nothing to compare.
_NOTHING_YET = "nothing allocated yet"


def _fresh_state() -> dict[str, Any]:
    return {
        "module": None,
        "looked": False,
        "note": "not looked for yet",
        "requested": False,
        "builder": None,
        "checked": {},  # (id(module), device index) -> (module, '' when it agrees, else what differed)
    }


_state = _fresh_state()


def module() -> ModuleType | None:
    """The loaded ``cuda_stats`` module, or None (off, not a CUDA build, not built, being
    built, or not loadable; :func:`status` says which). Never builds; looks for the file
    once, and once more after a build this process started (or found running in
    another, such as another rank's) has ended."""
    return load_once(_state, _lock, _load, building)


def _load() -> tuple[ModuleType | None, str]:
    return load_planned("cuda_stats", ABI, "loaded from {path}, not checked yet (needs a GPU in use)")


def request_build() -> bool:
    """Start building the module in the background (once per process, never with
    ``GPU_MEM_TRACK_NATIVE=off``, nor when it is built, failed before or cannot be built
    here). True when a build was started; :func:`module` finds it once it has ended."""
    return request_background(_state, _lock, lambda: start_build("cuda_stats"))


def building() -> bool:
    """Whether a build this process started is still running, or, after one was started,
    another process (another rank) holds the build's lock."""
    return build_running(_state, "cuda_stats")


def figures(nested: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """The five figures ``cuda_stats.read`` gives, from torch's nested statistics dict:
    allocated bytes (``allocated_bytes.all.current``) and their peak, reserved bytes and
    their peak, and the allocation calls plus frees counted
    (``allocation.all.allocated + allocation.all.freed``)."""
    allocated = nested["allocated_bytes"]["all"]
    reserved = nested["reserved_bytes"]["all"]
    calls = nested["allocation"]["all"]
    return (
        allocated["current"],
        allocated["peak"],
        reserved["current"],
        reserved["peak"],
        calls["allocated"] + calls["freed"],
    )


def checked_read(index: int, stats: Callable[[int], dict[str, Any]], found: Any = None) -> Read | None:
    """``cuda_stats.read`` when it reads what ``stats(index)`` (torch's nested dict) says
    on device ``index``, else None. Compared once per module, device and process: a native read,
    the dict, a native read again; equal, it agrees; the two native reads equal and the
    dict not, it disagrees (never used); the allocator moving between them (another
    thread allocating), tried again up to :data:`CHECK_TRIES` times. Figures all zero
    (nothing allocated on the device yet) prove nothing: the check is left for a later
    call (None until then; :func:`awaiting` says so). Call it only once the program has
    started CUDA. ``found``: the module to check (default :func:`module`; each module is
    checked on its own)."""
    reader = found if found is not None else module()
    if reader is None:
        return None
    checked = _state["checked"]
    key = (id(reader), index)
    if key not in checked:
        problem = _compare(reader.read, index, stats)
        where = f"cuda:{index}"
        if problem == _NOTHING_YET:
            _state["note"] = f"not checked yet: nothing allocated on {where} to compare"
            return None
        checked[key] = (reader, problem)  # keeps the reader alive
        if problem:
            _state["note"] = f"not used: checked against torch._C._cuda_memoryStats on {where}: {problem}"
        else:
            _state["note"] = f"in use: reads as torch._C._cuda_memoryStats does on {where}"
    return None if checked[key][1] else reader.read


def _compare(read: Read, index: int, stats: Callable[[int], dict[str, Any]]) -> str:
    """'' when ``read`` and the dict agree on device ``index``, else what differed."""
    for _ in range(CHECK_TRIES):
        try:
            before = tuple(read(index))
            expected = figures(stats(index))
            after = tuple(read(index))
        except Exception as error:
            return f"cannot compare: {type(error).__name__}: {str(error).strip()}"
        if before == after == expected:
            return _NOTHING_YET if not any(expected) else ""
        if before == after:
            return f"read {before}, the dict {expected}"
    return f"the allocator moved during each of {CHECK_TRIES} comparisons"


def awaiting(index: int, found: Any = None) -> bool:
    """Whether the module (``found``, default :func:`module`) is loaded and not checked yet
    on device ``index`` (:func:`checked_read` found nothing allocated there to compare)."""
    reader = found if found is not None else _state["module"]
    return reader is not None and (id(reader), index) not in _state["checked"]


def status() -> str:
    """One line: whether the CUDA statistics reader is in use, and why not."""
    if not _state["checked"]:
        module()
    return str(_state["note"])
