"""Renderers of a snapshot comparison (``compare``): the text report (``compare.txt``,
also printed) and its CSV files. They return strings or write to the streams they are
given; differences are B minus A, sizes bytes.

CSV files (one header row each):

- ``compare_lines.csv``: ``LINE_COLUMNS``, one row per line, largest difference first
  (``difference``: the larger of the two differences, allocated and held at the peak);
- ``compare_phases.csv``: ``PHASE_COLUMNS``, one row per phase;
- ``compare_sizes.csv``: ``SIZE_COLUMNS``, one row per request size whose counts differ,
  for each line (``scope`` ``line``, ``where``) and each phase (``scope`` ``phase``);
  ``bytes``: B's allocations of that size minus A's, in bytes.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import TextIO

from ..units import counted, format_bytes
from .compare import LineComparison, PhaseComparison, SizeDifference, SnapshotComparison

__all__ = [
    "LINE_COLUMNS",
    "PHASE_COLUMNS",
    "SIZE_COLUMNS",
    "render_comparison",
    "sizes_text",
    "write_lines_csv",
    "write_phases_csv",
    "write_sizes_csv",
]

LINE_COLUMNS = (
    "where", "file_a", "file_b", "function", "line", "code", "phase_a", "phase_b", "hits_a", "hits_b",
    "allocated_a", "allocated_b", "allocated_difference", "at_peak_a", "at_peak_b", "at_peak_difference",
    "difference",
)  # fmt: skip
PHASE_COLUMNS = (
    "phase", "hits_a", "hits_b", "allocated_a", "allocated_b", "allocated_difference", "at_peak_a",
    "at_peak_b", "at_peak_difference",
)  # fmt: skip
SIZE_COLUMNS = ("scope", "where", "size", "count_a", "count_b", "bytes")

#: The text's explanation of how lines are matched (also in the help and README).
MATCHING = (
    "Lines are matched by file, line number and function; files by name, and where names repeat by the "
    "most\ntrailing folders their paths share (a path recorded elsewhere still matches)."
)
_HEAD = "  ".join(
    f"{h:>12}" for h in ("Allocated A", "Allocated B", "B - A", "At peak A", "At peak B", "B - A")
)
_SIZES_SHOWN = 3


def render_comparison(comparison: SnapshotComparison, top: int = 10) -> str:
    """The whole text report: the two snapshots, their peaks, the phases and the lines
    (``top`` of them, largest difference first; 0: all), each with the request sizes
    whose counts differ (the largest ``_SIZES_SHOWN``)."""
    c = comparison
    out = [
        "gpu_mem_track snapshot comparison: B minus A",
        f"A: {c.name_a} ({c.source_a}; {_trace(c.entries_a)})",
        f"B: {c.name_b} ({c.source_b}; {_trace(c.entries_b)})",
        MATCHING,
        f"{c.matched} of {len(c.lines)} lines in both. Sizes A/B: a request size, then how many "
        "allocations of it each made.",
        "",
        f"{'':<22}{'A':>12}  {'B':>12}  {'B - A':>12}",
        _figure("peak allocated", c.peak_a, c.peak_b),
        _figure("highest reserved", c.max_reserved_a, c.max_reserved_b),
        _figure("allocated at the end", c.final_allocated_a, c.final_allocated_b),
        "",
        _phases(c.phases),
        _lines(c.lines, top),
    ]
    return "\n".join(out)


def _trace(entries: int) -> str:
    return f"trace of {entries:,} entries" if entries else "no trace: the blocks in use"


def _figure(what: str, a: int, b: int) -> str:
    return f"{what:<22}{format_bytes(a):>12}  {format_bytes(b):>12}  {format_bytes(b - a, signed=True):>12}"


def _numbers(allocated: tuple[int, int], at_peak: tuple[int, int]) -> str:
    return "  ".join(
        f"{format_bytes(x):>12}  {format_bytes(y):>12}  {format_bytes(y - x, signed=True):>12}"
        for x, y in (allocated, at_peak)
    )


def _phases(phases: Sequence[PhaseComparison]) -> str:
    out = ["Phases", "=" * 6, f"{_HEAD}  Phase"]
    for p in phases:
        numbers = _numbers((p.allocated_a, p.allocated_b), (p.at_peak_a, p.at_peak_b))
        out.append(f"{numbers}  {p.name}")
        out.extend(_sizes(p.sizes))
    return "\n".join(out) + "\n"


def _lines(lines: Sequence[LineComparison], top: int) -> str:
    shown = lines if top == 0 else lines[:top]
    heading = f"Lines, largest difference first (top {len(shown)} of {len(lines)})"
    out = [heading, "=" * len(heading), f"{_HEAD}  Where"]
    for u in shown:
        numbers = _numbers((u.allocated_a, u.allocated_b), (u.at_peak_a, u.at_peak_b))
        side = "" if u.file_a and u.file_b else (" (only in A)" if u.file_a else " (only in B)")
        code = f"  {u.code}" if u.code else ""
        out.append(f"{numbers}  {u.where}{side}{code}")
        out.extend(_sizes(u.sizes))
    return "\n".join(out) + "\n"


def sizes_text(sizes: Sequence[SizeDifference], shown: int = _SIZES_SHOWN) -> str:
    """``"12.28 GiB 0/1, 6.14 GiB 1/0 (and 2 more sizes)"``: the first ``shown`` request
    sizes with A's and B's counts."""
    text = ", ".join(f"{format_bytes(s.size)} {s.count_a}/{s.count_b}" for s in sizes[:shown])
    return text + (f" (and {counted(len(sizes) - shown, 'more size')})" if len(sizes) > shown else "")


def _sizes(sizes: Sequence[SizeDifference]) -> list[str]:
    if not sizes:
        return []
    shown = sizes_text(sizes)
    return [f"{'':>14}sizes A/B: {shown}"]


def write_lines_csv(stream: TextIO, comparison: SnapshotComparison) -> None:
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(LINE_COLUMNS)
    for u in comparison.lines:
        writer.writerow(
            [
                u.where, u.file_a, u.file_b, u.function, u.line, u.code, u.phase_a, u.phase_b, u.hits_a,
                u.hits_b, u.allocated_a, u.allocated_b, u.allocated_b - u.allocated_a, u.at_peak_a,
                u.at_peak_b, u.at_peak_b - u.at_peak_a, u.difference,
            ]
        )  # fmt: skip


def write_phases_csv(stream: TextIO, comparison: SnapshotComparison) -> None:
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(PHASE_COLUMNS)
    for p in comparison.phases:
        writer.writerow(
            [
                p.name, p.hits_a, p.hits_b, p.allocated_a, p.allocated_b, p.allocated_b - p.allocated_a,
                p.at_peak_a, p.at_peak_b, p.at_peak_b - p.at_peak_a,
            ]
        )  # fmt: skip


def write_sizes_csv(stream: TextIO, comparison: SnapshotComparison) -> None:
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(SIZE_COLUMNS)
    for u in comparison.lines:
        writer.writerows(["line", u.where, s.size, s.count_a, s.count_b, s.bytes] for s in u.sizes)
    for p in comparison.phases:
        writer.writerows(["phase", p.name, s.size, s.count_a, s.count_b, s.bytes] for s in p.sizes)
