"""The one replay of a recorded trace: rebuild the cache at the trace's start
(``rebuild``), replay every recorded call through ``Allocator``, and both compare what
it predicts with what torch did (``decisions.ReplayReport``, the allocator check) and
yield allocated and reserved bytes after every event (``timeline``, the ``snapshot``
report's figures).

Calls replayed (``calls.plan_calls``): each ``alloc`` (request size and stream) with
the segment events torch recorded just before it; each ``free_requested`` /
``free_completed`` by address (a free whose completion does not follow at once with
the same stack is deferred, as with ``record_stream``; a completion forced by the
release inside an allocation belongs to that allocation); each ``oom``; and each run
of ``segment_free`` events carrying ``empty_cache`` frames as one ``empty_cache()``, as
is a run no allocation can have made (none follows, no new segment follows it, or its
stack is not the allocation's: torch releases inside ``malloc`` only after ``cudaMalloc``
failed, then asks again, all with the allocation's stack), and a run the allocation did
not need because the model's cache serves it (an ``empty_cache()`` called from C++
carries the Python stack of the call it ran in: the ResNet-50 trace of
``shared/fixtures/h200`` has 63, inside convolutions, where cuDNN's benchmark searches).

What the end state and the trace leave open is settled by the replay itself: the
unsplit remainder of a block from before the trace that no sighting pins down is
inferred from the first best-fit decision it contradicts, and a trace whose first
allocation needed a segment the ring buffer dropped is recognised; each inference
costs one more replay.

The device answers as the recorded GPU did: it refuses ``cudaMalloc`` while the
simulator has released fewer segments in this call than torch did (torch releases
only after a refusal), refuses everything for a recorded ``oom``, and otherwise hands
out the recorded segment's address when the requested size is the recorded one (a
fresh address if not). So the addresses compared are torch's whenever the model
agrees, and what is tested is every decision: which segment sizes, when, which
segments are released, where each block goes, and the final cache block for block.

Expandable segments (``segment_map``/``segment_unmap``): the snapshot records their
mapped ranges, not the reserved address space around them, so the ranges are loaded as
plain segments and the model runs with ``expandable_segments`` on (blocks cut to the
rounded request, as torch cuts them there); map and unmap events are replayed with the
allocation (or ``empty_cache()``) they belong to and counted in reserved bytes, but
the model's own mapping decisions are not compared (``unsupported_events``), and the
figures are marked approximate.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from ..snapshotfile.records import Snapshot, TraceEntry
from .caching import Allocator
from .calls import Call, ReplayDevice, plan_calls
from .decisions import Mismatch, ReplayReport
from .rebuild import StartState, Tail, rebuild_start
from .records import SimulatedOutOfMemory
from .settings import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    AllocatorSettings,
    allocation_size,
    round_size,
    settings_from_snapshot,
)
from .tally import Tally, compare_final
from .timeline import Replay, Timeline, replay_check, tail_bounds

__all__ = ["Call", "Mismatch", "Replay", "ReplayReport", "plan_calls", "replay", "replay_snapshot"]

_SEGMENT_ACTIONS = ("segment_alloc", "segment_free")
_RELEASES = ("segment_free", "segment_unmap")
_EXPANDABLE_ACTIONS = ("segment_map", "segment_unmap")


@dataclass
class _Run:
    """The replay's running state and counts. ``open_tails``: start blocks whose end was
    not seen, by their assumed end, while they live; ``hint``: (tail address, an end it
    must reach) from the first decision that contradicts the assumption."""

    allocator: Allocator
    device: ReplayDevice
    keep: int
    open_tails: dict[int, Tail] = field(default_factory=dict)
    hint: tuple[int, int] | None = None
    cut: TraceEntry | None = None  # the segment_alloc a cut may have left out
    addresses: dict[int, int] = field(default_factory=dict)  # recorded -> simulated
    counts: Counter = field(default_factory=Counter)
    mismatches: list[Mismatch] = field(default_factory=list)
    mismatch_count: int = 0
    timeline: Timeline = field(default_factory=Timeline)

    def miss(self, index: int, what: str, recorded: str, predicted: str) -> None:
        self.mismatch_count += 1
        if len(self.mismatches) < self.keep:
            self.mismatches.append(Mismatch(index, what, recorded, predicted))


def replay_snapshot(
    snapshot: Snapshot, device: int = 0, settings: AllocatorSettings | None = None, keep: int = 20
) -> ReplayReport:
    """The allocator check: ``replay``'s verdict on the model's decisions."""
    return replay(snapshot, device, settings, keep).report


def replay(
    snapshot: Snapshot, device: int = 0, settings: AllocatorSettings | None = None, keep: int = 20
) -> Replay:
    """Replay ``snapshot``'s trace for ``device`` (empty: the end state only); settings:
    the snapshot's own unless given (the defaults where they cannot be read); ``keep``:
    how many mismatches to describe. An unsplit remainder the trace shows only through a
    best-fit decision is inferred and the replay run again."""
    trace = snapshot.device_trace(device)
    end = snapshot.device_segments(device)
    expandable = any(s.is_expandable for s in end) or any(e.action in _EXPANDABLE_ACTIONS for e in trace)
    settings = settings or _settings(snapshot)
    if expandable:
        settings = dataclasses.replace(settings, expandable_segments=True)
    calls, skipped = plan_calls(trace)
    ends: dict[int, int] = {}
    absent: frozenset[int] = frozenset()
    rounds = cut_bytes = 0
    while True:
        rounds += 1
        start = rebuild_start(end, trace, settings, ends, absent)
        run = _replay(start, calls, settings, keep)
        if run.cut is not None and not absent:
            absent, calls = frozenset({run.cut.addr}), [_with_cut_segment(calls[0], run.cut), *calls[1:]]
            cut_bytes = run.cut.size
        elif run.hint is None or ends.get(run.hint[0]) == run.hint[1] or rounds > 4 * len(start.tails) + 1:
            break
        else:
            ends[run.hint[0]] = run.hint[1]
    simulated = run.allocator.segments(device)
    report = _report(snapshot, device, settings, trace, end, start, run, skipped, rounds, simulated)
    report = dataclasses.replace(report, started_mid_call=bool(absent))
    return _figures(device, trace, end, (start, cut_bytes), run, simulated, report, expandable)


def _settings(snapshot: Snapshot) -> AllocatorSettings:
    """The snapshot's allocator settings (the defaults where they cannot be read)."""
    try:
        return settings_from_snapshot(snapshot.allocator_settings)
    except (ValueError, TypeError, AttributeError, KeyError):
        return AllocatorSettings()


def _figures(device, trace, end, start_state, run, simulated, report, expandable) -> Replay:  # noqa: ANN001
    """The replay's figures per event (``timeline``) and their check against the end.
    ``start_state``: the rebuilt start and the bytes of a segment the cut left out (it
    existed when the kept trace began, wholly free)."""
    start, cut_bytes = start_state
    live = [b for s in start.segments for b in s.blocks if b.state == "active_allocated"]
    blocks = tuple(sorted((b.address, b.size) for b in live))
    start_allocated = sum(size for _, size in blocks)
    start_reserved = sum(s.total_size for s in start.segments) + cut_bytes
    steps = run.timeline.steps(start_allocated, start_reserved)
    bounds, overruns = tail_bounds(start)
    counted = dict(blocks)
    freed = {}
    for index, entry in enumerate(trace):
        if entry.action == "free_requested" and entry.addr in counted and entry.addr not in freed:
            freed[entry.addr] = index
    tails = tuple((bound, freed[address]) for address, bound in bounds.items() if address in freed)
    final = (steps[-1].allocated, steps[-1].reserved) if steps else (start_allocated, start_reserved)
    decisions = 0 if expandable else run.mismatch_count  # placement in expandable ones: not followed
    unknown = (decisions + start.strays + overruns, len(bounds), sum(bounds.values()))
    allocated_in_trace = {e.addr for e in trace if e.action == "alloc"}
    check = replay_check(end, simulated, allocated_in_trace, final, unknown, expandable)
    cache = {**run.timeline.cache, -1: _start_cache(start, cut_bytes)}
    return Replay(device, start_allocated, start_reserved, steps, blocks, check, tails, report, cache)


def _start_cache(start: StartState, cut_bytes: int) -> tuple[int, int]:
    free = [b.size for s in start.segments for b in s.blocks if b.state == "inactive"]
    free += [cut_bytes] if cut_bytes else []
    return len(free), max(free, default=0)


def _with_cut_segment(call: Call, segment: TraceEntry) -> Call:
    """The first call with the ``segment_alloc`` the cut left out (index -1: not counted)."""
    return dataclasses.replace(call, segment_events=((-1, segment), *call.segment_events))


def _replay(start: StartState, calls: list[Call], settings: AllocatorSettings, keep: int) -> _Run:
    replay_device = ReplayDevice()
    run = _Run(Allocator.from_segments(start.segments, settings, device=replay_device), replay_device, keep)
    run.timeline = Timeline(run.allocator.allocated)
    run.open_tails = {t.end: t for t in start.tails if t.how != "seen"}
    for call in calls:
        if call.kind == "malloc" and _releases_apart(run.allocator, call):
            for part in _split_releases(call):
                _replay_call(run, part)
        else:
            _replay_call(run, call)
    return run


def _releases_apart(allocator: Allocator, call: Call) -> bool:
    """Whether the segment releases recorded within an allocation cannot be its own: the
    model's cache holds a free block that serves the request, so torch's ``malloc`` never
    called ``cudaMalloc``, and releases only follow a refused ``cudaMalloc``. They were an
    ``empty_cache()`` whose frames the trace does not hold: one called from C++, whose
    releases carry the Python stack of the call it ran in (the ResNet-50 trace in
    ``shared/fixtures/h200``: inside convolutions, where cuDNN's benchmark searches)."""
    if allocator.settings.expandable_segments:
        return False
    if not any(e.action in _RELEASES for _, e in call.segment_events):
        return False
    e = call.entry
    rounded = round_size(e.size, allocator.settings)
    pool = allocator.small_pool if rounded <= K_SMALL_SIZE else allocator.large_pool
    block = pool.free.at(pool.free.lower_bound(e.stream, rounded))
    if block is None or block.stream != e.stream:
        return False
    limit = allocator.settings.split_limit
    if rounded < limit <= block.size:
        return False
    return not (rounded >= limit and block.size >= rounded + allocator.settings.max_non_split_rounding_size)


def _split_releases(call: Call) -> list[Call]:
    """``call`` as the calls torch made: the completions and releases recorded up to the
    last release (an ``empty_cache()``), then the allocation with the events after it."""
    events = call.segment_events
    last = max(i for i, (_, e) in enumerate(events) if e.action in _RELEASES)
    before, after = events[: last + 1], events[last + 1 :]
    parts = [Call("complete", i, e) for i, e in before if e.action == "free_completed"]
    released = tuple((i, e) for i, e in before if e.action != "free_completed")
    parts.append(Call("empty_cache", released[0][0], released[0][1], released))
    parts.append(dataclasses.replace(call, segment_events=after))
    return parts


def _report(snapshot, device, settings, trace, end, start, run, skipped, rounds, simulated) -> ReplayReport:  # noqa: ANN001
    stats = run.allocator.stats
    c = run.counts
    final = compare_final(end, simulated)
    return ReplayReport(
        source=snapshot.source,
        device=device,
        events=len(trace),
        settings=settings.conf_string(),
        start_segments=len(start.segments),
        start_live_blocks=sum(1 for s in start.segments for b in s.blocks if b.state != "inactive"),
        tails=len(start.tails),
        pinned=start.count("seen"),
        inferred=start.count("given"),
        rounds=rounds,
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
    address, held, events = None, 0, (*call.segment_events, (call.index, call.entry))
    if call.kind == "malloc":
        address = _replay_malloc(run, call)
        _complete_absorbed(run, call)
    elif call.kind == "oom":
        _replay_oom(run, call)
        _complete_absorbed(run, call)
    elif call.kind in ("free", "complete"):
        address = run.addresses.get(call.entry.addr, call.entry.addr)
        held = _held(run, address, call.entry)
        _replay_free(run, call)
    else:
        run.counts["empty_cache"] += 1
        allocator.empty_cache()
        events = call.segment_events
    _compare_segments(run, call, mark)
    if call.kind == "malloc":
        held = _held(run, address, call.entry)
    run.timeline.record(events, held)
    if address is not None and call.kind == "malloc":
        run.timeline.keep_cache(call.index, allocator)


def _held(run: _Run, address: int | None, entry: TraceEntry) -> int:
    """The bytes of the simulated block at ``address`` for the recorded ``alloc`` or
    ``free_requested`` (the rounded request where the model holds none)."""
    block = run.allocator.active.get(address) if address is not None else None
    return block.size if block is not None else round_size(entry.size, run.allocator.settings)


def _replay_oom(run: _Run, call: Call) -> None:
    e = call.entry
    run.counts["oom.recorded"] += 1
    try:
        address = run.allocator.malloc(e.size, e.stream)
    except SimulatedOutOfMemory:
        run.counts["oom.predicted"] += 1
        run.counts["oom.matched"] += 1
        return
    run.miss(call.index, "oom", f"out of memory for {e.size} B", f"allocated at {address:#x}")


def _complete_absorbed(run: _Run, call: Call) -> None:
    """Complete the deferred frees recorded within an allocation that the simulator's
    own release did not complete."""
    for _, e in call.segment_events:
        if e.action == "free_completed":
            block = run.allocator.active.get(run.addresses.get(e.addr, e.addr))
            if block is not None and block.pending:
                run.allocator.complete_free(block.address)


def _replay_malloc(run: _Run, call: Call) -> int | None:
    """Replay an allocation; the simulated block's address (None: the model ran out)."""
    e = call.entry
    run.counts["alloc.recorded"] += 1
    after_tails = _free_after_tails(run) if run.open_tails and run.hint is None else {}
    try:
        address = run.allocator.malloc(e.size, e.stream)
    except SimulatedOutOfMemory:
        run.counts["oom.predicted"] += 1
        run.miss(call.index, "oom", f"alloc of {e.size} B at {e.addr:#x}", "out of memory")
        return None
    run.counts["alloc.predicted"] += 1
    run.addresses[e.addr] = address
    if address == e.addr:
        run.counts["alloc.matched"] += 1
        return address
    run.miss(call.index, "alloc address", f"{e.addr:#x} ({e.size} B)", f"{address:#x}")
    if address in after_tails:
        # torch did not take the free block after an open tail: it was too small for the
        # request, so the tail ends later, leaving less than the rounded request.
        tail = run.open_tails[address]
        rounded = round_size(e.size, run.allocator.settings)
        wanted = address + after_tails[address] - rounded + K_MIN_BLOCK_SIZE
        if tail.end < wanted <= tail.high:
            run.hint = (tail.address, wanted)
            return address
    if call.index == 0:
        run.cut = _cut_segment(run, e)
    return address


def _cut_segment(run: _Run, e: TraceEntry) -> TraceEntry | None:
    """When the trace's first allocation went to the start of a wholly free segment of
    the size it would have needed, the cut may have fallen between that segment's
    ``segment_alloc`` and the allocation: the segment did not exist before."""
    rounded = round_size(e.size, run.allocator.settings)
    pool = run.allocator.small_pool if rounded <= K_SMALL_SIZE else run.allocator.large_pool
    block = pool.free.get(e.addr)
    if block is None or block.is_split or block.size != allocation_size(rounded):
        return None
    return TraceEntry("segment_alloc", e.addr, block.size, block.stream)


def _free_after_tails(run: _Run) -> dict[int, int]:
    """The size of the free large-pool block starting at each open tail's end."""
    free = run.allocator.large_pool.free
    sizes = {}
    for end in run.open_tails:
        block = free.get(end)
        if block is not None:
            sizes[end] = block.size
    return sizes


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
    for end, tail in list(run.open_tails.items()):
        if tail.address == address:
            del run.open_tails[end]


def _compare_segments(run: _Run, call: Call, mark: int) -> None:
    events = run.allocator.events
    if not call.segment_events and all(e.action not in _SEGMENT_ACTIONS for e in events[mark:]):
        return  # nothing recorded, nothing done (most calls)
    recorded = [(e.action, e.addr, e.size) for i, e in call.segment_events if e.action in _SEGMENT_ACTIONS]
    predicted = [
        (ev.action, ev.address, ev.size)
        for ev in run.allocator.events[mark:]
        if ev.action in _SEGMENT_ACTIONS
    ]
    for index, e in call.segment_events:
        if index < 0 and (e.action, e.addr, e.size) in predicted:  # left out by the cut
            recorded.remove((e.action, e.addr, e.size))
            predicted.remove((e.action, e.addr, e.size))
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
