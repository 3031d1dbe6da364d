"""What the HTML report adds for a memory snapshot's analysis: the summary the text report
opens with (the peak and what set it, reserved bytes and the cache at the peak, the largest
free block, segments, ``empty_cache()`` runs; the phases), and per line its phase, its
bytes live at the peak and when it first and last allocated or freed in the trace; for two
snapshots, their comparison line by line and phase by phase (``snapshots.compare``).

The analysis is the ``snapshot.json`` a ``snapshot`` report folder holds (also written by
``run --snapshot``), i.e. ``snapshots.analyse.SnapshotAnalysis.to_dict()``. Sizes are
bytes; times in the page are seconds since the trace's first entry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..runfolder.records import TimelineRow
from ..units import format_bytes

__all__ = [
    "ANALYSIS_FILE",
    "MAX_COMPARED_LINES",
    "enrich_lines",
    "line_times",
    "read_analysis",
    "snapshot_comparison",
    "snapshot_summary",
]

#: The analysis file of a snapshot report folder.
ANALYSIS_FILE = "snapshot.json"
#: The largest ``snapshot.json`` read (bytes): ours hold one entry per source line.
_MAX_BYTES = 64 * 2**20
#: Lines of a snapshot comparison shown in the page (largest difference first).
MAX_COMPARED_LINES = 200


def read_analysis(folder: Path) -> dict[str, Any] | None:
    """The analysis of ``folder`` (a dict), None when it has no ``snapshot.json``;
    ``UsageError`` for one that is not ours."""
    path = folder / ANALYSIS_FILE
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise ValueError(f"larger than {format_bytes(_MAX_BYTES)}")
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != "gpu_mem_track snapshot":
            raise ValueError("not a gpu_mem_track snapshot analysis")
        return data
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"{path} cannot be read: {exc}") from exc


def snapshot_summary(analysis: dict[str, Any]) -> dict[str, Any]:
    """``{"rows": [[what, value], ...], "phases": [[phase, live at peak, allocated,
    allocations], ...]}``: the text report's peak and cache part, as page rows."""
    try:
        return {"rows": _rows(analysis), "phases": _phases(analysis)}
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"not a valid snapshot analysis ({exc!r})") from exc


def _rows(a: dict[str, Any]) -> list[list[str]]:
    peak, traced = a["peak"], bool(a.get("entries"))
    rows = _peak_rows(a) if traced else []
    if not traced:
        shown = format_bytes(peak["allocated"])
        rows.append(["allocated", f"{shown} when the snapshot was taken (no trace)"])
    rows += [
        ["reserved at the peak", format_bytes(peak["reserved"])],
        ["cache at the peak", f"{format_bytes(a['cache_at_peak'])} (reserved - allocated)"],
        ["largest free block", f"{format_bytes(a['largest_free'])} ({a['free_blocks']:,} free blocks)"],
    ]
    small, large = a.get("segments_at_end", (0, 0))
    rows.append(["segments at the end", f"{small + large:,} ({small:,} small, {large:,} large)"])
    return rows + (_trace_rows(a) if traced else [])


def _peak_rows(a: dict[str, Any]) -> list[list[str]]:
    """The trace, the peak and the allocation that set it."""
    peak = a["peak"]
    rows = [
        ["trace", f"{a['entries']:,} entries{_span(a)}"],
        ["peak allocated", f"{format_bytes(peak['allocated'])} {_when(a, peak.get('time_us'))}"],
    ]
    if peak.get("index") is not None:
        block, request = format_bytes(peak["block"]), format_bytes(peak["request"])
        rows.append(
            [
                "set by",
                f"entry {peak['index']}: a {block} block for a request of {request} "
                f"[{peak['category']}] at {_site(peak['site'])}",
            ]
        )
    if peak.get("bound", 0) > peak["allocated"]:
        rows.append(["peak at most", format_bytes(peak["bound"]) + " (blocks from before the trace)"])
    return rows


def _trace_rows(a: dict[str, Any]) -> list[list[str]]:
    """Allocated and reserved bytes at the trace's start and end, segments, empty_cache()."""
    rows = [
        [
            "allocated",
            f"{format_bytes(a['start_allocated'])} at the trace's start, "
            f"{format_bytes(a['final_allocated'])} at its end",
        ],
        [
            "reserved",
            f"{format_bytes(a['start_reserved'])} at the start, {format_bytes(a['final_reserved'])} at "
            f"the end, highest {format_bytes(a['max_reserved'])}; segments: "
            f"{a['segments_allocated']:,} allocated, {a['segments_freed']:,} freed",
        ],
    ]
    for at, released, count in a.get("empty_cache", ()):
        freed = format_bytes(released)
        rows.append(["empty_cache()", f"{_when(a, at)} released {freed} in {count} segments"])
    return rows + [["out of memory", f"recorded {_when(a, at)}"] for at in a.get("ooms", ())]


def _phases(a: dict[str, Any]) -> list[list[str]]:
    return [
        [c["name"], format_bytes(c["live_at_peak"]), format_bytes(c["allocated"]), f"{c['hits']:,}"]
        for c in a.get("categories", ())
    ]


def _span(a: dict[str, Any]) -> str:
    start, end = a.get("time_start_us"), a.get("time_end_us")
    return "" if start is None or end is None else f" over {(end - start) / 1e6:.3f} s"


def _when(a: dict[str, Any], time_us: int | None) -> str:
    start = a.get("time_start_us")
    if not time_us or start is None:
        return "at the trace's start"
    return f"at +{(time_us - start) / 1e6:.3f} s"


def _site(label: str) -> str:
    where, _, function = label.partition(" ")
    return f"{os.path.basename(where)} {function}".strip()


def line_times(rows: Iterable[TimelineRow]) -> dict[tuple[str, str, int], tuple[float, float]]:
    """``(file, function, line)`` -> the first and last seconds at which that line
    allocated or freed in the trace (the snapshot's ``timeline.csv`` rows)."""
    times: dict[tuple[str, str, int], tuple[float, float]] = {}
    for row in rows:
        if row.event != "line":
            continue
        key = (row.file, row.function, row.line or 0)
        first = times.get(key, (row.elapsed, row.elapsed))[0]
        times[key] = (first, row.elapsed)
    return times


def enrich_lines(
    lines: list[dict[str, Any]],
    analysis: dict[str, Any],
    times: dict[tuple[str, str, int], tuple[float, float]] | None,
) -> None:
    """Add to each line record (a ``LineRecord.to_dict()``) its ``phase`` and
    ``live_at_peak`` from the analysis and, with ``times``, its ``first`` and ``last``
    seconds in the trace (None where unknown)."""
    usage = {(u["file"], u["function"], u["line"]): u for u in analysis.get("lines", ())}
    for record in lines:
        key = (record["file"], record["function"], record["line"])
        found = usage.get(key, {})
        record["phase"] = found.get("category", "")
        record["live_at_peak"] = found.get("live_at_peak")
        if times is not None:
            record["first"], record["last"] = times.get(key, (None, None))


def snapshot_comparison(a: dict[str, Any], b: dict[str, Any], name_a: str, name_b: str) -> dict[str, Any]:
    """Two analyses compared (``snapshots.compare``) as page rows, B minus A: ``peaks``
    ``[what, A, B, B - A]``, ``phases`` and ``lines`` (the first ``MAX_COMPARED_LINES``)
    ``[where or phase, phase(s), allocated A, B, B - A, at peak A, B, B - A, sizes A/B]``,
    ``matching`` (how lines are matched), ``matched`` and ``total`` lines. ``UsageError``
    for analyses that cannot be compared."""
    from ..snapshots.compare import compare_analyses
    from ..snapshots.compare_report import MATCHING, sizes_text

    c = compare_analyses(a, b, name_a, name_b)

    def cells(allocated: tuple[int, int], at_peak: tuple[int, int]) -> list[str]:
        out = []
        for x, y in (allocated, at_peak):
            out += [format_bytes(x), format_bytes(y), format_bytes(y - x, signed=True)]
        return out

    def phases(first: str, second: str) -> str:
        return first if first == second or not second else f"{first or '-'} / {second}"

    return {
        "a": name_a,
        "b": name_b,
        "matching": MATCHING.replace("\n", " "),
        "matched": c.matched,
        "total": len(c.lines),
        "peaks": [
            [what, format_bytes(x), format_bytes(y), format_bytes(y - x, signed=True)]
            for what, x, y in (
                ("peak allocated", c.peak_a, c.peak_b),
                ("highest reserved", c.max_reserved_a, c.max_reserved_b),
                ("allocated at the end", c.final_allocated_a, c.final_allocated_b),
            )
        ],
        "phases": [
            [p.name, *cells((p.allocated_a, p.allocated_b), (p.at_peak_a, p.at_peak_b)), sizes_text(p.sizes)]
            for p in c.phases
        ],
        "lines": [
            [
                u.where + ("" if u.file_a and u.file_b else " (only in A)" if u.file_a else " (only in B)"),
                phases(u.phase_a, u.phase_b),
                *cells((u.allocated_a, u.allocated_b), (u.at_peak_a, u.at_peak_b)),
                sizes_text(u.sizes),
            ]
            for u in c.lines[:MAX_COMPARED_LINES]
        ],
    }
