"""Exact line peaks from a memory snapshot recorded during the run (``run --snapshot``).

Pure functions over records; nothing here measures, reads files or prints.

The allocator numbers its allocations and frees: the trace's ``alloc`` and
``free_requested`` entries (the *counted* entries) are numbers ``first + 1`` to ``end``,
where ``end`` is its count when the snapshot was taken and ``first = end - (counted
entries in the trace)`` (the ring buffer drops the oldest). A line execution whose count
went from ``start`` to ``stop`` (``history.LineWindows``) ran exactly the counted entries
``start + 1`` to ``stop``, in whatever thread. The replayed trace (``allocator.replay``)
gives the allocated bytes right after each of them, so the execution's peak is the
largest of those (the bytes before it are the runner's own reading). An execution whose
entries are not all in the trace keeps the runner's figure, and its line's peak is not
claimed exact. Each execution also checks the alignment: the replayed allocated bytes
at its start and end must be the runner's readings there.

A line is ``(file, function, line)`` as ``records.LineRecord`` names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from ..allocator.replay import Replay
from ..runfolder.records import LineRecord
from ..snapshotfile.records import Frame, Snapshot, TraceEntry

__all__ = [
    "COUNTED",
    "Window",
    "alignment_note",
    "counted_levels",
    "counted_positions",
    "innermost_lines",
    "merge_peaks",
    "place_frameless",
    "window_peaks",
]

#: The trace actions the allocator counts (``allocation.all.allocated`` and ``.freed``).
COUNTED = ("alloc", "free_requested")

Key = tuple[str, str, int]
#: One line execution: its line, the allocator's count when it started and ended, and the
#: allocated bytes read then.
Window = tuple[Key, int, int, int, int]


def counted_positions(trace: Sequence[TraceEntry]) -> list[int]:
    """Indexes in ``trace`` of its counted entries, in order."""
    return [i for i, entry in enumerate(trace) if entry.action in COUNTED]


def counted_levels(replayed: Replay) -> list[int]:
    """Allocated bytes right after each counted entry, in order (each one is a step)."""
    return [step.allocated for step in replayed.steps if step.entry.action in COUNTED]


def alignment_note(
    replayed: Replay,
    levels: Sequence[int],
    counted: int,
    start_allocated: int,
    end_allocated: int,
) -> str:
    """Why the trace cannot be matched with the allocator's readings ("" when it can).

    ``counted``: allocations and frees the allocator counted while recording;
    ``start_allocated``/``end_allocated``: allocated bytes it reported when recording
    started and when the snapshot was taken (bytes)."""
    traced = len(levels)
    if traced > counted:
        return (
            f"the trace holds {traced} allocations and frees but the allocator counted {counted} "
            "while recording (did the script record memory history itself?)"
        )
    final = levels[-1] if levels else replayed.start_allocated
    if final != end_allocated:
        return f"the replayed trace ends at {final} B allocated but the allocator reported {end_allocated} B"
    if traced == counted and replayed.start_allocated != start_allocated:
        return (
            f"the replayed trace starts at {replayed.start_allocated} B allocated but the allocator "
            f"reported {start_allocated} B"
        )
    return ""


def window_peaks(
    windows: Iterable[Window], levels: Sequence[int], first: int, start_level: int
) -> tuple[dict[Key, int], dict[Key, int], int]:
    """Per line: the highest allocated bytes inside its executions whose counted entries
    are all in the trace (bytes), and how many executions were not; then how many
    executions began or ended at allocated bytes other than the replay's (see the
    module docstring; ``first``: the count just before the trace's first counted entry;
    ``start_level``: the replayed allocated bytes then)."""
    peaks: dict[Key, int] = {}
    outside: dict[Key, int] = {}
    mismatched = 0
    for key, start, stop, before, after in windows:
        if start < first or stop - first > len(levels):
            outside[key] = outside.get(key, 0) + 1
            continue
        at_start = levels[start - first - 1] if start > first else start_level
        mismatched += at_start != before or levels[stop - first - 1] != after
        top = max(levels[start - first : stop - first])
        if top > peaks.get(key, -1):
            peaks[key] = top
    return peaks, outside, mismatched


def merge_peaks(
    records: Sequence[LineRecord], peaks: dict[Key, int], outside: dict[Key, int]
) -> list[LineRecord]:
    """The records with the trace's peaks: each line's peak is the larger of the
    runner's and the trace's, and exact unless one of its executions with allocations or
    frees fell outside the trace (then exact only if the runner's peak was and is not
    below the trace's). A line whose executions allocated and freed nothing kept the same
    memory throughout, so its peak is exact too."""
    out = []
    for record in records:
        key = (record.file, record.function, record.line)
        traced = peaks.get(key)
        peak = record.peak if traced is None else max(record.peak, traced)
        if outside.get(key):
            exact = record.peak_exact and (traced is None or record.peak >= traced)
        else:
            exact = True
        out.append(replace(record, peak=peak, peak_exact=exact))
    return out


def innermost_lines(windows: Iterable[Window], first: int, traced: int) -> list[Key | None]:
    """Per counted entry of the trace, the line whose execution was the innermost one
    running when it was made (None: none was). Executions nest (a line's window holds
    those of the lines it calls), so painting the longest first and the shortest last
    leaves each entry with its innermost line."""
    owners: list[Key | None] = [None] * traced
    for key, start, stop, _, _ in sorted(windows, key=lambda w: w[1] - w[2]):
        low, high = max(start - first, 0), min(stop - first, traced)
        if high > low:
            owners[low:high] = [key] * (high - low)
    return owners


def place_frameless(
    snapshot: Snapshot, device: int, positions: Sequence[int], owners: Sequence[Key | None]
) -> tuple[Snapshot, int]:
    """``snapshot`` with every counted entry of ``device`` that carries no stack (the
    autograd engine's threads run backward without Python frames) given one frame: the
    line that was running (``owners``, per counted entry). Returns it and how many were
    placed."""
    if device >= len(snapshot.device_traces):
        return snapshot, 0
    trace = list(snapshot.device_traces[device])
    placed = 0
    for position, key in zip(positions, owners):
        entry = trace[position]
        if entry.frames or key is None:
            continue
        trace[position] = replace(entry, frames=(Frame(key[0], key[2], key[1]),))
        placed += 1
    traces = list(snapshot.device_traces)
    traces[device] = tuple(trace)
    return replace(snapshot, device_traces=tuple(traces)), placed
