"""Text renderers of a run: the line table per function, the per-function summary, and the
short summary printed when the run ends. They return strings and never print."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from ..units import format_bytes, format_peak
from .records import HEAP_SOURCE, TENSORS_SOURCE, LineRecord, RunInfo, SnapshotMerge, by_function, hottest
from .simtext import short_path, simulation_lines, simulation_report

__all__ = ["paths_line", "render_launch_report", "render_line_report", "render_ranks", "render_summary"]

_HEAD = (
    f"{'Line #':>7}  {'Memory':>12}  {'Increment':>12}  {'Rise':>12}  {'Peak':>13}  {'Hits':>7}"
    "  Line Contents"
)
#: What CPU figures mean, for the report and the summary.
_CPU_NOTE = (
    "CPU: memory is the process's resident set size. Freed tensors go back to the C allocator, "
    "which reuses them\nwithout returning them to the system, so increments are RSS movements, "
    "not tensor bytes, and a line's\nsummed increments over a loop can exceed the run's peak. "
    "--memory heap measures the C heap in use\n(tensors included) instead, --memory tensors the "
    "bytes of live CPU tensor storages; a census\n(--census-threshold) names the tensors."
)
#: The same for ``--memory heap``.
_HEAP_NOTE = (
    "CPU: memory is the C heap in use (glibc mallinfo2: bytes malloc has handed out and not taken "
    "back):\ntensor storage plus other C/C++ data, not Python objects. A freed tensor subtracts at "
    "once. No high-water\nmark exists for it, so every peak is a lower bound (the larger of "
    "before and after)."
)
#: The same for ``--memory tensors``.
_TENSORS_NOTE = (
    "CPU: memory is the bytes of live CPU tensor storages made by torch ops in the script's "
    "thread since the run\nstarted (not other threads, torch.load or from_numpy storages, nor "
    "resizes); peaks are exact."
)


def render_line_report(
    info: RunInfo,
    records: Sequence[LineRecord],
    censuses: Sequence[str] = (),
    snapshot: SnapshotMerge | None = None,
) -> str:
    """The whole text report: run header (with how a ``--snapshot`` was used), a summary
    of the hottest lines per function, the line table of every function, then the
    automatic censuses, each already rendered (``tracker.render.render_stamp``'s text)."""
    header = _run_header(info) + (_snapshot_text(snapshot) + "\n" if snapshot is not None else "")
    parts = [header, _function_summary(records)]
    if info.simulation is not None:
        parts.append(simulation_report(info.simulation))
    for (file, function), lines in by_function(list(records)).items():
        parts.append(_function_table(file, function, lines))
    if censuses:
        parts.append(_censuses(censuses))
    return "\n".join(parts)


def render_summary(
    info: RunInfo,
    records: Sequence[LineRecord],
    folder: Path,
    top: int = 5,
    snapshot: SnapshotMerge | None = None,
    unwritten: Collection[str] = (),
) -> str:
    """The few lines printed at the end of a run: the ``top`` lines (0: all) that raised
    memory most, how a ``--snapshot`` was used, which path read the lines
    (:func:`paths_line`; not for runs recorded before it was), and the report files in ``folder``,
    without those named in ``unwritten`` (file names that could not be written: a full
    disk)."""
    lines = [f"gpu_mem_track: {_ending(info)} | memory: {_source(info)} | {_peak(info)}"]
    best = hottest(list(records), top)
    if best:
        lines.append(f"Lines that raised memory most (of {len(records)} traced; rise, net increment):")
        for r in best:
            lines.append(
                f"  {short_path(r.file)}:{r.line} {r.function}  {_rise(r)}  net {_signed(r.increment)}"
                f"  peak {_peak_text(r)}  x{r.hits}  {r.code}"
            )
    lines += simulation_lines(info)
    if info.memory_source == "cuda allocator" and not info.peak and info.simulation is None:
        lines.append("Note: the script allocated no CUDA memory; --device cpu measures the process RSS.")
    if info.rank is not None:
        lines[0] += f" | rank {info.rank} of {info.world_size}"
    note = _SHORT_NOTES.get(info.memory_source)
    if note:
        lines.append(note)
    if snapshot is not None:
        lines.append(_snapshot_text(snapshot))
    if info.line_sink:
        lines.append(paths_line(info))
    lines.append(_reports_line(folder, snapshot, unwritten))
    return "\n".join(lines) + "\n"


def paths_line(info: RunInfo) -> str:
    """Which path the run's lines (and a real GPU's statistics) were read through, from
    ``info.line_sink``, ``line_sink_note`` and ``stats_reader``: ``Line sink: native``, or
    ``Line sink: Python (why)``, and ``CUDA statistics: native reader`` or ``torch's dict``."""
    if info.line_sink == "native":
        text = "Line sink: native"
    else:
        note = info.line_sink_note
        if note == "being built in the background":
            note = "the native one is being built in the background; the next runs use it"
        text = f"Line sink: Python ({note})" if note else "Line sink: Python"
    reader = {"native": "native reader", "dict": "torch's dict"}.get(info.stats_reader)
    return f"{text} | CUDA statistics: {reader}" if reader else text


def _reports_line(folder: Path, snapshot: SnapshotMerge | None, unwritten: Collection[str]) -> str:
    """Where the reports are, naming only the files that were written."""
    files = ["report.txt", "lines.csv", "timeline.csv"]
    if snapshot is not None and snapshot.file:
        files += [snapshot.file, "snapshot_lines.csv"]
    written = ", ".join(name for name in files if name not in unwritten) or "none written"
    return f"Reports: {short_path(str(folder))}{os.sep} ({written})"


def render_ranks(summary: Any) -> str:
    """The ranks table of a launch (``ranktable.LaunchSummary``): per rank its status,
    device, peak, the line and phase of the peak and the memory at the end, then the
    spread of the peaks."""
    head = f"{'Rank':>4}  {'Status':<8}  {'Device':<7}  {'Peak':>11}  {'At end':>11}  Peak at (phase)"
    out = [head, "=" * len(head)]
    for r in summary.ranks:
        phase = f" ({r.peak_phase})" if r.peak_phase else ""
        out.append(
            f"{r.rank:>4}  {r.status:<8}  {r.device or '-':<7}  {_bytes_or_dash(r.peak):>11}  "
            f"{_bytes_or_dash(r.end_memory):>11}  {short_path(r.peak_at) or '-'}{phase}"
        )
    if summary.spread is not None:
        out.append(_spread(summary))
    broken = [str(r.rank) for r in summary.ranks if r.status in ("no end", "missing")]
    if broken:
        out.append(
            f"No clean end recorded for rank {', '.join(broken)} (killed, still running or never started)"
        )
    return "\n".join(out) + "\n"


def render_launch_report(summary: Any) -> str:
    """``report.txt`` of a launch folder: what ran, the ranks table, where each rank's
    own report is."""
    return (
        f"gpu_mem_track launch {summary.launch}: {short_path(summary.script) or '?'}"
        f" on {summary.world_size} ranks\n\n{render_ranks(summary)}\n"
        "Each rank's line report: rank<k>/report.txt\n"
    )


def _bytes_or_dash(nbytes: int | None) -> str:
    return "-" if nbytes is None else format_bytes(nbytes)


def _run_header(info: RunInfo) -> str:
    return (
        f"gpu_mem_track run {info.run_name}: {' '.join(info.argv)}\n"
        f"{_ending(info)} | device {info.device} | memory: {_source(info)} | engine {info.engine}\n"
        f"{_rank(info)}{_peak(info)} | Python {info.python} | torch {info.torch or '-'}"
        f" | gpu_mem_track {info.gpu_mem_track}\n"
        "Memory: after the line's last run. Increment: net, summed over its runs (callees included). "
        "Rise: the most one run\nraised memory above its start (what it allocated, even when it "
        "freed more). Peak: highest while it ran;\n'>=' marks a lower bound (the high-water mark "
        "did not move during the line). Hits: executions of the\nstatement starting on the line. "
        "The run's peak is named at the first line that allocated it (rose by more than\n1% of it, "
        "ending within 1% of it).\n"
        + (_note(info) + "\n" if _note(info) else "")
        + _lines(simulation_lines(info))
    )


def _lines(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _function_summary(records: Sequence[LineRecord], per_function: int = 3) -> str:
    out = ["Summary: per function, the lines that raised memory most (rise, net increment)", "=" * 79]
    groups = by_function(list(records))
    ranked = sorted(groups.items(), key=lambda item: -max(r.growth for r in item[1]))
    for (file, function), lines in ranked:
        best = hottest(lines, per_function)
        if not best:
            continue
        out.append(f"{short_path(file)} {function}")
        for r in best:
            rise, net, peak = _rise(r), _signed(r.increment), _peak_text(r)
            out.append(f"  line {r.line:<6} {rise:>12} {net:>12}  peak {peak:>13}  x{r.hits:<6} {r.code}")
    if len(out) == 2:
        out.append("(no line raised memory)")
    return "\n".join(out) + "\n"


def _function_table(file: str, function: str, lines: Sequence[LineRecord]) -> str:
    out = [f"File: {file}", f"Function: {function}", "", _HEAD, "=" * len(_HEAD)]
    for r in lines:
        out.append(
            f"{r.line:>7}  {format_bytes(r.memory):>12}  {_signed(r.increment):>12}  {_rise(r):>12}  "
            f"{_peak_text(r):>13}  {r.hits:>7}  {r.code}"
        )
    return "\n".join(out) + "\n"


def _censuses(texts: Sequence[str]) -> str:
    out = ["Automatic censuses (changes since the previous one)", "=" * 51]
    out.extend(text.rstrip("\n") for text in texts)
    return "\n".join(out) + "\n"


def _snapshot_text(merge: SnapshotMerge) -> str:
    """One or two lines on the run's memory snapshot: what it holds and what it gave."""
    if not merge.file:
        return f"Snapshot: none written: {merge.note}."
    held = f"Snapshot: {merge.file}, {merge.entries} trace entries of cuda:{merge.device}"
    if merge.note:
        return f"{held}; its peaks were not used: {merge.note}."
    counted = f"{merge.traced} of the {merge.counted} allocations and frees made while recording"
    out = [f"{held} ({counted})."]
    out.append(
        f"Line peaks from the trace: {merge.exact} of {merge.lines} lines exact, {merge.raised} raised"
        f" above the runner's readings"
        + (f"; {merge.outside} line runs fell out of the trace (--snapshot-entries)" if merge.outside else "")
        + "."
    )
    return "\n".join(out)


def _spread(summary: Any) -> str:
    """The spread line: largest peak over smallest, naming the ranks at each end (every
    rank tied at the largest or the smallest), or saying that all peaked alike."""
    peaks = [r for r in summary.ranks if r.peak]
    high, low = max(r.peak for r in peaks), min(r.peak for r in peaks)
    head = f"Spread: largest peak / smallest = {summary.spread:.3f}"
    if len(peaks) == 1:
        return f"{head} (one rank with a peak: rank {peaks[0].rank})"
    if high == low:
        return f"{head} (all {len(peaks)} ranks peaked at {format_bytes(high)})"
    tops = ", ".join(str(r.rank) for r in peaks if r.peak == high)
    bottoms = ", ".join(str(r.rank) for r in peaks if r.peak == low)
    return f"{head} (rank {tops} / rank {bottoms})"


def _ending(info: RunInfo) -> str:
    script = short_path(info.script)
    if info.exit_code is None:
        return f"{script} did not end (killed, or still running)"
    seconds = f" after {info.ended - info.started:.1f} s" if info.ended is not None else ""
    return f"{script} exited with {info.exit_code}{seconds}"


_SHORT_NOTES = {
    "process RSS": "Note: CPU figures are RSS movements, not tensor bytes (freed memory stays with the C "
    "allocator for reuse); --memory tensors or --census-threshold show tensor bytes.",
    HEAP_SOURCE: "Note: CPU figures are the C heap in use (tensors and other C/C++ data); peaks are "
    "lower bounds.",
    TENSORS_SOURCE: "Note: CPU figures are live tensor storages made by torch ops in the script's thread.",
}


def _note(info: RunInfo) -> str:
    """What the figures mean where they are not allocator bytes ("" on CUDA)."""
    return {"process RSS": _CPU_NOTE, HEAP_SOURCE: _HEAP_NOTE, TENSORS_SOURCE: _TENSORS_NOTE}.get(
        info.memory_source, ""
    )


def _source(info: RunInfo) -> str:
    if info.memory_source == "process RSS":
        return "process RSS (CPU: not tensor bytes; tensors named by the census)"
    if info.memory_source == "cuda allocator":
        return "CUDA caching allocator (allocated bytes)"
    return info.memory_source


def _rank(info: RunInfo) -> str:
    if info.rank is None:
        return ""
    return f"rank {info.rank} of {info.world_size} (local rank {info.local_rank}) of {info.launch} | "


def _peak(info: RunInfo) -> str:
    if info.peak is None:
        return "peak unknown (no memory reading recorded)"
    at = f" at {short_path(info.peak_at)}" if info.peak_at else ""
    phase = f" (after {info.peak_phase!r})" if info.peak_phase else ""
    return f"peak {format_bytes(info.peak)}{at}{phase}"


def _rise(record: LineRecord) -> str:
    return "-" if record.rise is None else _signed(record.rise)


def _peak_text(record: LineRecord) -> str:
    return format_peak(record.peak, record.peak_exact)


def _signed(nbytes: int) -> str:
    return format_bytes(nbytes, signed=True)
