"""A memory budget for unpickling: how much the resident set may grow while the C
unpickler builds a snapshot before the loader stops it and checks the file's shape
instead (``shape``).

``resident_bytes`` reads this process's resident set: ``/proc/self/statm`` where it
exists (Linux: the current size, a few microseconds a read), else the peak from
``resource.getrusage`` (the growth of the peak is a lower bound of the growth: in a
process that peaked higher before, the guard trips late or not at all), else nothing
(0: the budget is never crossed). :class:`MemoryGuard` is called once per chunk the
stream makes (64 KiB); it raises :class:`OverBudget` once the resident set has grown
past its budget since the guard was made.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

__all__ = ["MEMORY_BUDGET", "MemoryGuard", "OverBudget", "resident_bytes"]

#: How far the resident set may grow (bytes) while a snapshot is unpickled before its
#: shape is checked: real snapshots of up to about 50-90 MB unpacked stay under it
#: (they take 4-8 bytes of memory per byte of pickle). A file that is not one is stopped
#: here, though a dict growing its table at that moment may briefly take about as much
#: again: the peak stays under 1 GiB.
MEMORY_BUDGET = 384 * 2**20


class OverBudget(Exception):
    """The resident set grew past the guard's budget."""


def _statm() -> Callable[[], int] | None:
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None
    page = os.sysconf("SC_PAGE_SIZE")

    def read() -> int:
        return int(os.pread(fd, 128, 0).split()[1]) * page

    try:
        read()
    except (OSError, ValueError, IndexError):
        os.close(fd)
        return None
    return read


def _peak() -> int:
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # KiB elsewhere


#: The resident set of this process in bytes (the peak where the current is unknown).
resident_bytes: Callable[[], int] = _statm() or _peak


class MemoryGuard:
    """Raises :class:`OverBudget` when ``rss()`` (bytes) has grown more than ``budget``
    bytes since the guard was made; call it as often as is cheap."""

    def __init__(self, budget: int, rss: Callable[[], int] | None = None) -> None:
        self.budget = budget
        self._rss = rss or resident_bytes
        self.start = self._rss()

    def __call__(self) -> None:
        if self._rss() - self.start > self.budget:
            raise OverBudget(f"the resident set grew past {self.budget:,} bytes")
