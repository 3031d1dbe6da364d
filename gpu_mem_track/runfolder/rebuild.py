"""Per-line records rebuilt from a runner's timeline, for a run that has no
``lines.csv`` (it is written when a run ends; a run killed with SIGKILL, or still
running, has none)."""

from __future__ import annotations

import linecache
import math
from collections.abc import Callable
from pathlib import Path

from .records import LineRecord, TimelineRow

__all__ = ["LineTotals", "rebuilt_note"]


class LineTotals:
    """Per-line records rebuilt from a timeline's ``line`` rows, for a run without a
    ``lines.csv`` (written when a run ends; a killed run has none).

    Per source line (file and line number): ``hits`` the rows counted, ``memory`` the
    last, ``increment`` the sum, ``peak`` the highest, ``rise`` the most one row's peak
    stood above its start (memory minus increment), as the runner aggregates them.
    The timeline does not say whether a peak was read from a high-water mark the line
    raised, so every peak counts as a lower bound (``peak_exact`` False); it records
    when a line ended, not when it started, so ``seconds`` is NaN (unknown). ``code`` is
    the source line as ``source(file, line)`` reads it now (default: ``linecache``;
    ``""`` when the file is gone).
    """

    def __init__(self, source: Callable[[str, int], str] | None = None) -> None:
        self._source = source or linecache.getline
        self._stats: dict[tuple[str, int], list] = {}  # [function, hits, memory, increment, peak, rise]

    def add(self, row: TimelineRow) -> None:
        """Count one timeline row (rows of other events, or without memory, are ignored)."""
        if row.event != "line" or row.line is None or row.memory is None:
            return
        stats = self._stats.get((row.file, row.line))
        if stats is None:
            stats = self._stats[(row.file, row.line)] = [row.function, 0, 0, 0, 0, 0]
        increment = row.increment or 0
        peak = row.peak if row.peak is not None else row.memory
        stats[1] += 1
        stats[2] = row.memory
        stats[3] += increment
        stats[4] = max(stats[4], peak)
        stats[5] = max(stats[5], peak - (row.memory - increment))

    def records(self) -> list[LineRecord]:
        """The records, in file and line order."""
        return [
            LineRecord(
                file=file,
                function=function,
                line=line,
                code=self._source(file, line).strip(),
                hits=hits,
                memory=memory,
                increment=increment,
                peak=peak,
                peak_exact=False,
                seconds=math.nan,
                rise=rise,
            )
            for (file, line), (function, hits, memory, increment, peak, rise) in sorted(self._stats.items())
        ]


def rebuilt_note(path: Path, folder: bool, empty: bool = False) -> str:
    """The one line that says a run's per-line figures were rebuilt from its timeline:
    ``path`` is the run folder (``folder``) or the ``timeline.csv`` given; ``empty``: the
    folder's ``lines.csv`` is there but empty."""
    rebuilt = "per-line figures rebuilt from {} (peaks as lower bounds, code text read from the sources now)"
    if not folder:
        return f"{path}: " + rebuilt.format("this timeline")
    if empty:
        why = "an empty lines.csv (the run was stopped while writing it)"
    else:
        why = "no lines.csv (written when a run ends: this one was stopped or is still running)"
    return f"{path} has {why}; " + rebuilt.format("its timeline.csv")
