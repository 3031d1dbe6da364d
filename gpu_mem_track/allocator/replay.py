"""Check the simulator against a recorded trace: rebuild the cache at the trace's start
(``rebuild``), replay every recorded call through ``Allocator``, and compare what it
predicts with what torch did.

Calls replayed: each ``alloc`` (request size and stream) with the segment events torch
recorded just before it; each ``free_requested``/``free_completed`` by address (a free
whose completion does not follow at once is deferred, as with ``record_stream``); each
``oom``; and each run of ``segment_free`` events carrying ``empty_cache`` frames (or,
without frames, not followed by an allocation) as one ``empty_cache()``.

The device answers as the recorded GPU did: it refuses ``cudaMalloc`` while the
simulator has released fewer segments in this call than torch did (torch releases
only after a refusal), refuses everything for a recorded ``oom``, and otherwise hands
out the recorded segment's address when the requested size is the recorded one (a
fresh address if not). So the addresses compared are torch's whenever the model
agrees, and what is tested is every decision: which segment sizes, when, which
segments are released, where each block goes, and the final cache block for block.
Expandable-segment traces (``segment_map``/``segment_unmap``) are not replayed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ..snapshots.records import Snapshot, TraceEntry
from .caching import Allocator
from .device import SimulatedDevice
from .rebuild import rebuild_start
from .records import SimulatedOutOfMemory
from .settings import AllocatorSettings, settings_from_snapshot
from .tally import Tally, compare_final

__all__ = ["Call", "Mismatch", "ReplayReport", "plan_calls", "replay_snapshot"]

_SEGMENT_ACTIONS = ("segment_alloc", "segment_free")


@dataclass(frozen=True)
class Call:
    """One call to replay: ``kind`` (``malloc``, ``oom``, ``free``, ``complete``,
    ``empty_cache``), the index and entry of its recorded event (for ``empty_cache``,
    its first ``segment_free``), the segment events torch recorded for it, and for a
    ``free`` whether its completion comes later (``deferred``)."""

    kind: str
    index: int
    entry: TraceEntry
    segment_events: tuple[tuple[int, TraceEntry], ...] = ()
    deferred: bool = False


@dataclass(frozen=True)
class Mismatch:
    """Where the prediction left the record: the event index, what was compared
    (``alloc address``, ``segments``, ``oom``, ``free``), recorded and predicted."""

    index: int
    what: str
    recorded: str
    predicted: str


@dataclass(frozen=True)
class ReplayReport:
    """The outcome of a replay (all counts; bytes where named).

    ``allocs``: recorded allocations, those replayed, those placed at torch's address.
    ``segment_allocs``/``segment_frees``: recorded, predicted, and matched (same call,
    address and size). ``ooms``: recorded, predicted, matched. ``final_segments`` /
    ``final_blocks``: the end state, recorded vs simulated, matched when equal (address,
    size, type; blocks: address, size, state, and request when live). ``tails`` and
    ``pinned``: start-state blocks whose unsplit remainder the trace had to settle.
    ``mismatches``: the first ones, in order. ``peak_allocated``/``peak_reserved``: the
    simulated peaks over the replay (bytes).
    """

    source: str
    device: int
    events: int
    settings: str
    start_segments: int
    start_live_blocks: int
    tails: int
    pinned: int
    allocs: Tally
    segment_allocs: Tally
    segment_frees: Tally
    empty_cache_calls: int
    ooms: Tally
    final_segments: Tally
    final_blocks: Tally
    unsupported_events: int
    peak_allocated: int
    peak_reserved: int
    mismatch_count: int
    mismatches: tuple[Mismatch, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def all_match(self) -> bool:
        """Every recorded decision predicted and nothing more."""
        tallies = (self.allocs, self.segment_allocs, self.segment_frees, self.ooms)
        return (
            all(t.exact for t in tallies)
            and self.final_segments.exact
            and self.final_blocks.exact
            and not self.mismatch_count
            and not self.problems
            and not self.unsupported_events
        )

    def to_dict(self) -> dict:
        out = asdict(self)
        out["all_match"] = self.all_match
        return out


class ReplayDevice(SimulatedDevice):
    """A device that answers each call as the recorded GPU did (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(None, base=1 << 60)  # fresh addresses never collide with real ones
        self.expected: list[TraceEntry] = []
        self.frees_needed = 0
        self.refuse = False
        self.frees_done = lambda: 0

    def plan(self, call: Call, frees_done) -> None:
        recorded = [e for _, e in call.segment_events]
        self.expected = [e for e in recorded if e.action == "segment_alloc"]
        self.frees_needed = sum(1 for e in recorded if e.action == "segment_free")
        self.refuse = call.kind == "oom"
        self.frees_done = frees_done

    def malloc(self, size: int) -> int | None:
        if self.refuse or self.frees_done() < self.frees_needed:
            return None
        if self.expected:
            recorded = self.expected.pop(0)
            if recorded.size == size:
                self._used += size
                return recorded.addr
        return super().malloc(size)


def _empty_cache_frames(entry: TraceEntry, cache: dict) -> bool:
    key = id(entry.frames)
    if key not in cache:
        cache[key] = any("empty_cache" in f.name or "emptyCache" in f.name for f in entry.frames)
    return cache[key]


def plan_calls(trace: Sequence[TraceEntry]) -> tuple[list[Call], int]:
    """The calls to replay, in order, and the number of events left out (expandable
    segments' map/unmap). See the module doc for how events are grouped."""
    calls: list[Call] = []
    waiting: list[tuple[int, TraceEntry]] = []
    frames: dict = {}
    skipped = 0

    def flush() -> None:
        if waiting:  # segment frees no allocation claimed: an empty_cache without frames
            calls.append(Call("empty_cache", waiting[0][0], waiting[0][1], tuple(waiting)))
            waiting.clear()

    for index, e in enumerate(trace):
        action = e.action
        if action == "segment_free" and _empty_cache_frames(e, frames):
            flush()
            last = calls[-1] if calls else None
            if last is not None and last.kind == "empty_cache" and last.segment_events[-1][0] == index - 1:
                calls[-1] = Call("empty_cache", last.index, last.entry, (*last.segment_events, (index, e)))
            else:
                calls.append(Call("empty_cache", index, e, ((index, e),)))
        elif action in _SEGMENT_ACTIONS:
            waiting.append((index, e))
        elif action in ("alloc", "oom"):
            calls.append(Call("malloc" if action == "alloc" else "oom", index, e, tuple(waiting)))
            waiting.clear()
        elif action == "free_requested":
            flush()
            following = trace[index + 1] if index + 1 < len(trace) else None
            soon = following is not None and following.action == "free_completed" and following.addr == e.addr
            calls.append(Call("free", index, e, deferred=not soon))
        elif action == "free_completed":
            flush()
            previous = trace[index - 1] if index else None
            if previous is None or previous.action != "free_requested" or previous.addr != e.addr:
                calls.append(Call("complete", index, e))
        elif action in ("segment_map", "segment_unmap"):
            skipped += 1
    flush()
    return calls, skipped


@dataclass
class _Run:
    """The replay's running state and counts."""

    allocator: Allocator
    device: ReplayDevice
    keep: int
    addresses: dict[int, int] = field(default_factory=dict)  # recorded -> simulated
    counts: Counter = field(default_factory=Counter)
    mismatches: list[Mismatch] = field(default_factory=list)
    mismatch_count: int = 0

    def miss(self, index: int, what: str, recorded: str, predicted: str) -> None:
        self.mismatch_count += 1
        if len(self.mismatches) < self.keep:
            self.mismatches.append(Mismatch(index, what, recorded, predicted))


def replay_snapshot(
    snapshot: Snapshot, device: int = 0, settings: AllocatorSettings | None = None, keep: int = 20
) -> ReplayReport:
    """Replay ``snapshot``'s trace for ``device`` (settings: the snapshot's own unless
    given); ``keep``: how many mismatches to describe."""
    settings = settings or settings_from_snapshot(snapshot.allocator_settings)
    trace = snapshot.device_traces[device] if device < len(snapshot.device_traces) else ()
    end = snapshot.device_segments(device)
    start = rebuild_start(end, trace, settings)
    replay_device = ReplayDevice()
    run = _Run(Allocator.from_segments(start.segments, settings, device=replay_device), replay_device, keep)
    calls, skipped = plan_calls(trace)
    for call in calls:
        _replay_call(run, call)
    stats = run.allocator.stats
    c = run.counts
    final = compare_final(end, run.allocator.segments(device))
    return ReplayReport(
        source=snapshot.source,
        device=device,
        events=len(trace),
        settings=settings.conf_string(),
        start_segments=len(start.segments),
        start_live_blocks=sum(1 for s in start.segments for b in s.blocks if b.state != "inactive"),
        tails=start.tails,
        pinned=start.pinned,
        allocs=Tally(c["alloc.recorded"], c["alloc.predicted"], c["alloc.matched"]),
        segment_allocs=Tally(
            c["segment_alloc.recorded"], c["segment_alloc.predicted"], c["segment_alloc.matched"]
        ),
        segment_frees=Tally(
            c["segment_free.recorded"], c["segment_free.predicted"], c["segment_free.matched"]
        ),
        empty_cache_calls=c["empty_cache"],
        ooms=Tally(c["oom.recorded"], c["oom.predicted"], c["oom.matched"]),
        final_segments=final[0],
        final_blocks=final[1],
        unsupported_events=skipped,
        peak_allocated=stats.get("allocated_bytes").peak,
        peak_reserved=stats.get("reserved_bytes").peak,
        mismatch_count=run.mismatch_count,
        mismatches=tuple(run.mismatches),
        problems=start.problems,
    )


def _replay_call(run: _Run, call: Call) -> None:
    allocator = run.allocator
    mark = len(allocator.events)
    run.device.plan(call, lambda: sum(1 for ev in allocator.events[mark:] if ev.action == "segment_free"))
    e = call.entry
    if call.kind == "malloc":
        _replay_malloc(run, call)
    elif call.kind == "oom":
        run.counts["oom.recorded"] += 1
        try:
            allocator.malloc(e.size, e.stream)
            run.miss(call.index, "oom", f"out of memory for {e.size} B", "allocated")
        except SimulatedOutOfMemory:
            run.counts["oom.predicted"] += 1
            run.counts["oom.matched"] += 1
    elif call.kind in ("free", "complete"):
        _replay_free(run, call)
    else:
        run.counts["empty_cache"] += 1
        allocator.empty_cache()
    _compare_segments(run, call, mark)


def _replay_malloc(run: _Run, call: Call) -> None:
    e = call.entry
    run.counts["alloc.recorded"] += 1
    try:
        address = run.allocator.malloc(e.size, e.stream)
    except SimulatedOutOfMemory:
        run.counts["oom.predicted"] += 1
        run.miss(call.index, "oom", f"alloc of {e.size} B at {e.addr:#x}", "out of memory")
        return
    run.counts["alloc.predicted"] += 1
    run.addresses[e.addr] = address
    if address == e.addr:
        run.counts["alloc.matched"] += 1
    else:
        run.miss(call.index, "alloc address", f"{e.addr:#x} ({e.size} B)", f"{address:#x}")


def _replay_free(run: _Run, call: Call) -> None:
    e = call.entry
    address = run.addresses.get(e.addr, e.addr)
    try:
        if call.kind == "free":
            run.allocator.free(address, deferred=call.deferred)
        else:
            run.allocator.complete_free(address)
    except KeyError as exc:
        run.miss(call.index, "free", f"{call.kind} at {e.addr:#x}", str(exc))
        return
    if call.kind == "complete" or not call.deferred:
        run.addresses.pop(e.addr, None)


def _compare_segments(run: _Run, call: Call, mark: int) -> None:
    recorded = [(e.action, e.addr, e.size) for _, e in call.segment_events]
    predicted = [
        (ev.action, ev.address, ev.size)
        for ev in run.allocator.events[mark:]
        if ev.action in _SEGMENT_ACTIONS
    ]
    if not recorded and not predicted:
        return
    common = Counter(recorded) & Counter(predicted)
    for action in _SEGMENT_ACTIONS:
        run.counts[f"{action}.recorded"] += sum(1 for r in recorded if r[0] == action)
        run.counts[f"{action}.predicted"] += sum(1 for p in predicted if p[0] == action)
        run.counts[f"{action}.matched"] += sum(n for k, n in common.items() if k[0] == action)
    if recorded != predicted:
        run.miss(call.index, "segments", _describe(recorded), _describe(predicted))


def _describe(events: list[tuple[str, int, int]]) -> str:
    if not events:
        return "none"
    shown = "; ".join(f"{a} {s} B at {addr:#x}" for a, addr, s in events[:3])
    return shown + (f"; ... ({len(events)} in all)" if len(events) > 3 else "")
