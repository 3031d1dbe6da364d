"""The per-line and per-phase records of a snapshot analysis (``analyse``): bytes each
site and each phase allocated, freed and held, and the request sizes they allocated.
Records only; ``tally`` sums them over a replayed trace."""

from __future__ import annotations

import linecache
import os
from dataclasses import asdict, dataclass
from typing import Any

from .attribution import Site

__all__ = ["AllocationSizes", "CategoryUsage", "LineUsage", "source_code"]


@dataclass(frozen=True)
class LineUsage:
    """One site over the trace. ``hits``: allocations made there (without a trace: blocks
    in use); ``allocated``: their bytes in total; ``freed``: bytes freed there;
    ``live_at_peak``/``live_at_end``: bytes it allocated still in use at the peak / at
    the end; ``memory``: allocated bytes (whole device) after its last allocation or
    free; ``peak``: the highest allocated bytes right after one of its allocations (the
    device figure at the snapshot without a trace, a lower bound); ``category``: the
    phase most of its bytes were allocated in; ``code``: the source line where the file
    is readable here, else ``<line N>``."""

    file: str
    function: str
    line: int
    code: str
    category: str
    hits: int
    allocated: int
    freed: int
    live_at_peak: int
    live_at_end: int
    memory: int
    peak: int

    @property
    def site(self) -> Site:
        return Site(self.file, self.function, self.line)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CategoryUsage:
    """One phase (``attribution.CATEGORIES``): allocations, their bytes, bytes live at the
    peak."""

    name: str
    hits: int
    allocated: int
    live_at_peak: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AllocationSizes:
    """The requests one site made in one phase: ``counts`` holds (request bytes,
    allocations of that size), largest size first. Without a trace: the blocks in use
    at the snapshot, by their requested bytes."""

    file: str
    function: str
    line: int
    phase: str
    counts: tuple[tuple[int, int], ...]

    @property
    def site(self) -> Site:
        return Site(self.file, self.function, self.line)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "counts": [list(pair) for pair in self.counts]}


def source_code(file: str, line: int) -> str:
    """The stripped source of ``file:line`` when that file is readable here, else
    ``<line N>`` (so lines still match by number); ``""`` for pseudo-sites."""
    if line <= 0 or file.startswith("<"):
        return ""
    text = linecache.getline(file, line).strip() if os.path.isfile(file) else ""
    return text or f"<line {line}>"
