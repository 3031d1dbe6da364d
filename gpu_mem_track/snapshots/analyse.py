"""Analyse a memory snapshot as the runner reports a script: the peak of allocated bytes
(replayed from the trace through the allocator model, see ``allocator.replay``) with its
time and line, reserved bytes, bytes per source line and per phase, and the cache and
fragmentation at the peak.

Every figure is bytes of the caching allocator's ``allocated_bytes`` (blocks, 512 B
rounded, unsplit tails included) or ``reserved_bytes`` (segments). Lines are the sites of
``attribution``: the innermost user frame of the stack that allocated (or freed); phases
are read from the stacks in the trace's order (``phases``: autograd's allocations carry
no Python frame, and belong to the backward call running).
A snapshot without a trace gives what it has: the blocks in use per line, and the
segments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..allocator.replay import Replay
from ..allocator.timeline import ReplayCheck, Step
from ..snapshotfile.records import Snapshot
from .attribution import PRE_TRACE, Attributor, Site
from .phases import TraceReading, read_trace
from .tally import Tally
from .usage import AllocationSizes, CategoryUsage, LineUsage, source_code

__all__ = [
    "AllocationSizes",
    "CategoryUsage",
    "LineUsage",
    "Peak",
    "SnapshotAnalysis",
    "analyse",
    "peak_bound",
    "pick_device",
    "source_code",
]


@dataclass(frozen=True)
class Peak:
    """The highest allocated bytes and the moment: ``index`` in the trace (None: the end
    state of a snapshot without a trace, or the trace's start), ``time_us`` (epoch
    microseconds; None if unknown), ``reserved`` then, the ``site`` and ``category`` of
    the allocation that reached it and its ``block`` and ``request`` bytes (0 if none).
    ``bound``: the most the true peak could be, when blocks from before the trace kept
    unknown tails (``allocator.timeline.Replay.tails``; equal to ``allocated`` otherwise)."""

    allocated: int
    reserved: int
    index: int | None
    time_us: int | None
    site: Site
    category: str
    block: int = 0
    request: int = 0
    bound: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "site": self.site.label}


@dataclass(frozen=True)
class SnapshotAnalysis:
    """A whole analysis; every size in bytes, times in epoch microseconds.

    ``devices``: all devices in the snapshot; ``entries``: trace entries of ``device``;
    ``cache_at_peak``: reserved minus allocated at the peak (free blocks, pending frees);
    ``largest_free``/``free_blocks``: the largest free cached block then and how many;
    ``empty_cache``: (time_us, bytes released, segments) per ``empty_cache()`` run;
    ``ooms``: times of recorded out-of-memory errors; ``unmatched_include``: ``--include``
    values no frame matched; ``segments_at_end``: (small, large) segments recorded;
    ``sizes``: the request sizes each site allocated in each phase (``AllocationSizes``;
    what ``compare`` compares).
    """

    source: str
    device: int
    devices: tuple[int, ...]
    entries: int
    time_start_us: int | None
    time_end_us: int | None
    start_allocated: int
    start_reserved: int
    final_allocated: int
    final_reserved: int
    max_reserved: int
    peak: Peak
    cache_at_peak: int
    largest_free: int
    free_blocks: int
    segments_allocated: int
    segments_freed: int
    empty_cache: tuple[tuple[int, int, int], ...]
    ooms: tuple[int, ...]
    lines: tuple[LineUsage, ...]
    categories: tuple[CategoryUsage, ...]
    check: ReplayCheck
    include: tuple[str, ...] = ()
    unmatched_include: tuple[str, ...] = ()
    segments_at_end: tuple[int, int] = (0, 0)
    sizes: tuple[AllocationSizes, ...] = ()

    @property
    def has_trace(self) -> bool:
        return self.entries > 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            peak=self.peak.to_dict(),
            check=self.check.to_dict(),
            lines=[line.to_dict() for line in self.lines],
            categories=[c.to_dict() for c in self.categories],
            sizes=[s.to_dict() for s in self.sizes],
        )
        return {"format": "gpu_mem_track snapshot", "version": 1, **data}


def pick_device(snapshot: Snapshot, device: int | None = None) -> int:
    """``device`` if given, else the device with the longest trace, else the one with the
    most segments (0 for an empty snapshot)."""
    if device is not None:
        return device
    traces = snapshot.device_traces
    if any(traces):
        return max(range(len(traces)), key=lambda i: len(traces[i]))
    counts: dict[int, int] = {}
    for segment in snapshot.segments:
        counts[segment.device] = counts.get(segment.device, 0) + 1
    return max(counts, key=lambda d: counts[d]) if counts else 0


def analyse(
    snapshot: Snapshot, replayed: Replay, attributor: Attributor, reading: TraceReading | None = None
) -> SnapshotAnalysis:
    """The analysis of ``replayed`` (``allocator.replay.replay(snapshot, device)``);
    ``reading``: its trace read in order (``phases.read_trace``; read here when None)."""
    device = replayed.device
    trace = snapshot.device_trace(device)
    if not trace:
        return _without_trace(snapshot, replayed, attributor)
    peak_at = _peak_step(replayed)
    reading = reading or read_trace(trace, attributor)
    tally = Tally(attributor)
    tally.walk(replayed, peak_at, reading)
    peak = _peak(replayed, peak_at, attributor, trace, reading)
    free_blocks, largest_free = replayed.free_after(peak.index)
    segment_steps = [s for s in replayed.steps if s.entry.action.startswith("segment_")]
    empty_cache = _empty_cache_runs(replayed.steps)
    return SnapshotAnalysis(
        source=snapshot.source,
        device=device,
        devices=snapshot.devices(),
        entries=len(trace),
        time_start_us=trace[0].time_us or None,
        time_end_us=trace[-1].time_us or None,
        start_allocated=replayed.start_allocated,
        start_reserved=replayed.start_reserved,
        final_allocated=replayed.final_allocated,
        final_reserved=replayed.final_reserved,
        max_reserved=max([replayed.start_reserved, *(s.reserved for s in replayed.steps)]),
        peak=peak,
        cache_at_peak=peak.reserved - peak.allocated,
        largest_free=largest_free,
        free_blocks=free_blocks,
        segments_allocated=sum(s.entry.action == "segment_alloc" for s in segment_steps),
        segments_freed=sum(s.entry.action == "segment_free" for s in segment_steps),
        empty_cache=empty_cache,
        ooms=tuple(s.entry.time_us for s in replayed.steps if s.entry.action == "oom"),
        lines=tally.lines(),
        categories=tally.categories(),
        check=replayed.check,
        include=attributor.include,
        unmatched_include=attributor.unmatched(),
        segments_at_end=_segment_counts(snapshot, device),
        sizes=tally.sizes(),
    )


def _segment_counts(snapshot: Snapshot, device: int) -> tuple[int, int]:
    kinds = [s.segment_type for s in snapshot.device_segments(device)]
    return kinds.count("small"), len(kinds) - kinds.count("small")


def _peak_step(replayed: Replay) -> int | None:
    """Position in ``steps`` of the first step reaching the highest allocated bytes (None:
    the start was the highest)."""
    best, at = replayed.start_allocated, None
    for position, step in enumerate(replayed.steps):
        if step.allocated > best:
            best, at = step.allocated, position
    return at


def _peak(
    replayed: Replay, at: int | None, attributor: Attributor, trace: Sequence[Any], reading: TraceReading
) -> Peak:
    bound = peak_bound(replayed)
    if at is None:
        return Peak(
            replayed.start_allocated,
            replayed.start_reserved,
            None,
            trace[0].time_us or None,
            PRE_TRACE,
            "before recording",
            bound=max(bound, replayed.start_allocated),
        )
    step = replayed.steps[at]
    return Peak(
        step.allocated,
        step.reserved,
        step.index,
        step.entry.time_us or None,
        reading.site(step.index, step.entry.frames, attributor),
        reading.phases[step.index],
        step.bytes,
        step.entry.size,
        max(bound, step.allocated),
    )


def peak_bound(replayed: Replay) -> int:
    """The most the highest allocated bytes of the replay could be, every unknown tail of a
    block from before the trace at its largest (the replayed peak when none is unknown)."""
    best = replayed.start_allocated + replayed.uncertainty(None)
    pending = sorted(replayed.tails, key=lambda tail: tail[1])
    extra, position = sum(bound for bound, _ in pending), 0
    for step in replayed.steps:
        while position < len(pending) and pending[position][1] <= step.index:
            extra -= pending[position][0]
            position += 1
        best = max(best, step.allocated + extra)
    return best


def _empty_cache_runs(steps: Iterable[Step]) -> tuple[tuple[int, int, int], ...]:
    """Runs of ``segment_free`` (or ``segment_unmap``) whose stack passes through
    ``empty_cache``."""
    runs: list[list[int]] = []
    previous = None
    for step in steps:
        entry = step.entry
        emptying = entry.action in ("segment_free", "segment_unmap") and any(
            "emptyCache" in f.name or f.name == "empty_cache" for f in entry.frames
        )
        if emptying:
            if previous is not None and runs and previous == "empty":
                runs[-1][1] += entry.size
                runs[-1][2] += 1
            else:
                runs.append([entry.time_us, entry.size, 1])
        previous = "empty" if emptying else entry.action
    return tuple((t, b, n) for t, b, n in runs)


def _without_trace(snapshot: Snapshot, replayed: Replay, attributor: Attributor) -> SnapshotAnalysis:
    """A snapshot without a trace: the blocks in use per line, at the snapshot's moment."""
    allocated, reserved = replayed.final_allocated, replayed.final_reserved
    tally = Tally(attributor)
    for segment in snapshot.device_segments(replayed.device):
        for block in segment.blocks:
            if block.state == "active_allocated":
                site, category = attributor.describe(block.frames)
                tally.block(site, category, block.size, allocated, block.requested_size)
    free_blocks, largest_free = replayed.free_after(None)  # the end state: no trace
    peak = Peak(allocated, reserved, None, None, Site("<snapshot>", "end state", 0), "", bound=allocated)
    return SnapshotAnalysis(
        snapshot.source, replayed.device, snapshot.devices(), 0, None, None, allocated, reserved,
        allocated, reserved, reserved, peak, reserved - allocated, largest_free, free_blocks,
        0, 0, (), (), tally.lines(), tally.categories(), replayed.check, attributor.include,
        attributor.unmatched(), _segment_counts(snapshot, replayed.device), tally.sizes(),
    )  # fmt: skip
