"""Text renderers of a snapshot analysis: the whole report (``report.txt``) and the few
lines printed when the command ends. They return strings and never print."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..allocator.timeline import ReplayCheck
from ..units import format_bytes
from .analyse import LineUsage, SnapshotAnalysis

__all__ = ["render_report", "render_summary"]

_PHASES = "Phases (from the stacks, in order: no Python frame while backward() runs is backward)"
_HEAD = f"{'Live at peak':>13}  {'Allocated':>12}  {'Freed':>12}  {'Allocs':>7}  {'Phase':<16}  Where"


def render_report(analysis: SnapshotAnalysis, name: str, top: int = 10) -> str:
    """The whole text report: header, peak, reserved and cache, phases, the lines live at
    the peak and those that allocated most, and the check against the recorded segments."""
    parts = [_header(analysis, name), _peak(analysis), _phases(analysis)]
    parts.append(_lines("Lines by bytes live at the peak", analysis.lines, top, lambda u: u.live_at_peak))
    if analysis.has_trace:
        parts.append(
            _lines("Lines by bytes allocated in the trace", analysis.lines, top, lambda u: u.allocated)
        )
    parts.append(_check(analysis.check, analysis.has_trace))
    return "\n".join(parts)


def render_summary(analysis: SnapshotAnalysis, folder: Path, top: int = 5) -> str:
    """What the command prints for one snapshot."""
    out = [f"gpu_mem_track: {_short(analysis.source)} | {_peak_line(analysis)}"]
    best = [u for u in analysis.lines if u.live_at_peak > 0][:top]
    if best:
        out.append(f"Live at the peak, by line (top {len(best)} of {len(analysis.lines)}):")
        out.extend(f"  {format_bytes(u.live_at_peak):>12}  {_where(u)}" for u in best)
    if not analysis.check.exact:
        out.append(f"Note: {_check_line(analysis.check)}")
    if analysis.unmatched_include:
        out.append(f"Note: --include matched no frame: {', '.join(analysis.unmatched_include)}")
    out.append(f"Reports: {folder}{os.sep} (report.txt, lines.csv, timeline.csv, snapshot_lines.csv)")
    return "\n".join(out) + "\n"


def _header(analysis: SnapshotAnalysis, name: str) -> str:
    devices = ", ".join(f"cuda:{d}" for d in analysis.devices) or "none"
    lines = [
        f"gpu_mem_track snapshot {name}: {analysis.source}",
        f"device cuda:{analysis.device} (in the snapshot: {devices})",
    ]
    if analysis.has_trace:
        span = _span(analysis)
        lines.append(f"trace: {analysis.entries:,} entries{span}")
    else:
        lines.append("trace: none recorded; figures are the blocks in use when the snapshot was taken")
    if analysis.include:
        lines.append(f"--include: {', '.join(analysis.include)}")
    if analysis.unmatched_include:
        lines.append(f"Note: --include matched no frame: {', '.join(analysis.unmatched_include)}")
    lines.append(
        "Memory: the CUDA caching allocator's allocated bytes (blocks: 512 B rounding and unsplit tails "
        "included), replayed\nfrom the trace; reserved: its segments. Lines: the innermost frame of user "
        "code in the allocating stack."
    )
    return "\n".join(lines) + "\n"


def _span(analysis: SnapshotAnalysis) -> str:
    if analysis.time_start_us is None or analysis.time_end_us is None:
        return ""
    seconds = (analysis.time_end_us - analysis.time_start_us) / 1e6
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(analysis.time_start_us / 1e6))
    return f" over {seconds:.3f} s, from {when}"


def _peak_line(analysis: SnapshotAnalysis) -> str:
    peak = analysis.peak
    if not analysis.has_trace:
        return f"allocated {format_bytes(peak.allocated)} | reserved {format_bytes(peak.reserved)} (no trace)"
    when = _when(analysis, peak.time_us)
    upto = f" (<= {format_bytes(peak.bound)})" if peak.bound > peak.allocated else ""
    return f"peak allocated {format_bytes(peak.allocated)}{upto} {when} by {_site(peak.site.label)}"


def _when(analysis: SnapshotAnalysis, time_us: int | None) -> str:
    if time_us is None or analysis.time_start_us is None:
        return "at the trace's start" if analysis.peak.index is None else f"at entry {analysis.peak.index}"
    return f"at +{(time_us - analysis.time_start_us) / 1e6:.3f} s"


def _peak(analysis: SnapshotAnalysis) -> str:
    peak, out = analysis.peak, ["Peak", "=" * 4]
    if analysis.has_trace:
        out.append(
            f"allocated {format_bytes(peak.allocated)} ({peak.allocated:,} B) {_when(analysis, peak.time_us)}"
        )
        if peak.index is not None:
            out.append(
                f"  set by entry {peak.index}: a {format_bytes(peak.block)} block for a request of "
                f"{format_bytes(peak.request)} [{peak.category}]"
            )
        out.append(f"  at {_site(peak.site.label)}")
        if peak.bound > peak.allocated:
            out.append(
                f"  (up to {format_bytes(peak.bound)} if the unknown tails of blocks from before the trace "
                "were at their largest; see the check below)"
            )
    else:
        out.append(
            f"allocated {format_bytes(peak.allocated)} when the snapshot was taken (the peak is not known)"
        )
    out.append(
        f"reserved then {format_bytes(peak.reserved)}; cache (reserved - allocated) "
        f"{format_bytes(analysis.cache_at_peak)}; largest free block {format_bytes(analysis.largest_free)} "
        f"({analysis.free_blocks} free blocks)"
    )
    small, large = analysis.segments_at_end
    out.append(f"segments when the snapshot was taken: {small + large:,} ({small:,} small, {large:,} large)")
    if analysis.has_trace:
        out += _over_the_trace(analysis)
    return "\n".join(out) + "\n"


def _over_the_trace(analysis: SnapshotAnalysis) -> list[str]:
    """Allocated and reserved bytes at the trace's start and end, segments, empty_cache()."""
    out = [
        f"allocated {format_bytes(analysis.start_allocated)} at the trace's start (before recording), "
        f"{format_bytes(analysis.final_allocated)} at its end",
        f"reserved {format_bytes(analysis.start_reserved)} at the start, "
        f"{format_bytes(analysis.final_reserved)} at the end, highest "
        f"{format_bytes(analysis.max_reserved)}; segments: "
        f"{analysis.segments_allocated} allocated, {analysis.segments_freed} freed",
    ]
    for at, released, count in analysis.empty_cache:
        out.append(
            f"empty_cache() {_when(analysis, at or None)} released {format_bytes(released)} "
            f"in {count} segments"
        )
    out.extend(f"out of memory recorded {_when(analysis, at or None)}" for at in analysis.ooms)
    return out


def _phases(analysis: SnapshotAnalysis) -> str:
    out = [
        _PHASES,
        "=" * len(_PHASES),
        f"{'Live at peak':>13}  {'Allocated':>12}  {'Allocs':>7}  Phase",
    ]
    for c in analysis.categories:
        out.append(
            f"{format_bytes(c.live_at_peak):>13}  {format_bytes(c.allocated):>12}  {c.hits:>7}  {c.name}"
        )
    return "\n".join(out) + "\n"


def _lines(title: str, usages: Sequence[LineUsage], top: int, key: Callable[[LineUsage], int]) -> str:
    ranked = sorted((u for u in usages if key(u) > 0), key=lambda u: (-key(u), u.file, u.line))
    shown = ranked if top == 0 else ranked[:top]
    heading = f"{title} (top {len(shown)} of {len(ranked)})"
    out = [heading, "=" * len(heading), _HEAD]
    for u in shown:
        out.append(
            f"{format_bytes(u.live_at_peak):>13}  {format_bytes(u.allocated):>12}  "
            f"{format_bytes(u.freed):>12}  {u.hits:>7}  {u.category:<16}  {_where(u)}"
        )
    return "\n".join(out) + "\n"


def _check(check: ReplayCheck, has_trace: bool) -> str:
    out = ["Check against the recorded segments", "=" * 35, _check_line(check)]
    if has_trace:
        out.append(
            f"blocks in use reproduced in {check.segments_matching} of {check.segments} segments; sizes of "
            f"{check.blocks_matching} of {check.blocks_checked} blocks allocated in the trace and still in "
            "use"
        )
    if check.unresolved_tails:
        out.append(
            f"{check.unresolved_tails} blocks from before the trace kept an unknown tail: figures before "
            f"their frees may be up to {format_bytes(check.tail_bytes)} low"
        )
    if check.approximate:
        out.append("expandable segments: block sizes are the rounded requests (tails not modelled)")
    return "\n".join(out) + "\n"


def _check_line(check: ReplayCheck) -> str:
    def pair(replayed: int, recorded: int) -> str:
        sign = "=" if replayed == recorded else "!="
        return f"{format_bytes(replayed)} {sign} recorded {format_bytes(recorded)}"

    text = (
        f"final allocated replayed {pair(check.final_allocated_replayed, check.final_allocated_recorded)}; "
        f"reserved {pair(check.final_reserved_replayed, check.final_reserved_recorded)}"
    )
    return text + (
        f"; {check.misfits} recorded decisions the allocator model did not make (figures after them are "
        "the model's)"
        if check.misfits
        else ""
    )


def _where(usage: LineUsage) -> str:
    site = _site(usage.site.label)
    return f"{site}  {usage.code}" if usage.code and not usage.code.startswith("<line") else site


def _site(label: str) -> str:
    return label  # paths of the recording machine: shown as recorded


def _short(path: str) -> str:
    """A path relative to the working folder when it is inside it."""
    if not path or path.startswith("<"):
        return path
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative
