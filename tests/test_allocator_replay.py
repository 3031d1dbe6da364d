"""The trace replay: the cache rebuilt at a trace's start (the unsplit-tail inference
included), hand-built traces replayed, and random workloads of the simulator replayed
from their own event log cut at a random point, as a ring buffer would cut it."""

from __future__ import annotations

import dataclasses
import random

import pytest
import snapshotfiles as sf

from gpu_mem_track.allocator import Allocator, AllocatorSettings, SimulatedOutOfMemory, parse_alloc_conf
from gpu_mem_track.allocator.rebuild import rebuild_start
from gpu_mem_track.allocator.replay import ReplayReport, plan_calls, replay, replay_snapshot
from gpu_mem_track.allocator.rules import rule_violations
from gpu_mem_track.snapshotfile import load_snapshot, snapshot_from_data

MIB = 2**20


BASE = sf.BASE
CACHE_FRAMES = [{"name": "empty_cache", "filename": "/torch/cuda/memory.py", "line": 218}]


def _tail_snapshot(sighting: bool = True) -> dict:
    """Before the trace: a 20 MiB segment holding A (a 16.5 MiB request handed out whole
    as 17 MiB) and 3 MiB free; a cached small segment. The trace allocates C (3 MiB) in
    the free 3 MiB, frees A, empties the cache, and allocates 100 B."""
    a_req, c_at, small_at, new_small = int(16.5 * MIB), BASE + 17 * MIB, BASE + 32 * MIB, BASE + 64 * MIB
    trace = []
    if sighting:
        trace.append(sf.entry("alloc", c_at, 3 * MIB, 1))
    trace += [sf.entry("free_requested", BASE, a_req, 2), sf.entry("free_completed", BASE, a_req, 3)]
    freeing = sf.entry("segment_free", small_at, 2 * MIB, 4)
    freeing["frames"] = CACHE_FRAMES
    trace += [freeing, sf.entry("segment_alloc", new_small, 2 * MIB, 5), sf.entry("alloc", new_small, 100, 5)]
    large = [(17 * MIB, 0, "inactive"), (3 * MIB, 3 * MIB, "active_allocated")]
    if not sighting:
        large = [(20 * MIB, 0, "inactive")]
    segments = [
        sf.segment(BASE, large),
        sf.segment(new_small, [(512, 100, "active_allocated"), (2 * MIB - 512, 0, "inactive")], "small"),
    ]
    return sf.snapshot(segments, trace)


def test_rebuild_pins_the_unsplit_tail_with_a_later_allocation() -> None:
    snap = snapshot_from_data(_tail_snapshot())
    start = rebuild_start(snap.segments, snap.device_traces[0], AllocatorSettings())
    assert (len(start.tails), start.count("seen"), start.problems) == (1, 1, ())
    first = start.segments[0]
    assert [(b.size, b.state) for b in first.blocks] == [
        (17 * MIB, "active_allocated"),
        (3 * MIB, "inactive"),
    ]
    assert [s.address for s in start.segments] == [
        BASE,
        BASE + 32 * MIB,
    ]  # the released small segment is back


def test_rebuild_without_a_sighting_takes_the_rounded_size() -> None:
    snap = snapshot_from_data(_tail_snapshot(sighting=False))
    start = rebuild_start(snap.segments, snap.device_traces[0], AllocatorSettings())
    assert (len(start.tails), start.count("assumed")) == (1, 1)
    assert [b.size for b in start.segments[0].blocks] == [int(16.5 * MIB), int(3.5 * MIB)]


def test_replay_of_a_hand_built_trace_matches() -> None:
    report = replay_snapshot(snapshot_from_data(_tail_snapshot(), "tail.pickle"))
    assert report.all_match, report.mismatches
    assert (report.allocs.matched, report.segment_allocs.matched, report.segment_frees.matched) == (2, 1, 1)
    assert (report.final_segments.matched, report.final_blocks.matched) == (2, 4)
    assert (report.empty_cache_calls, report.tails, report.pinned, report.rounds) == (1, 1, 1, 1)
    assert report.to_dict()["all_match"] is True


def test_replay_finds_a_decision_the_model_would_not_make() -> None:
    data = _tail_snapshot()
    alloc = data["device_traces"][0][-1]
    alloc["addr"] += 1024  # torch "put" the 100 B block 1 KiB into its new segment
    data["segments"][1] = sf.segment(
        BASE + 64 * MIB,
        [(1024, 0, "inactive"), (512, 100, "active_allocated"), (2 * MIB - 1536, 0, "inactive")],
        "small",
    )
    report = replay_snapshot(snapshot_from_data(data))
    assert not report.all_match
    assert report.allocs.matched == 1 and report.mismatches[0].what == "alloc address"
    assert report.final_blocks.matched == 2  # the large segment's two blocks


def test_plan_calls_groups_events() -> None:
    trace = snapshot_from_data(_tail_snapshot()).device_traces[0]
    calls, skipped = plan_calls(trace)
    assert [c.kind for c in calls] == ["malloc", "free", "empty_cache", "malloc"]
    assert [len(c.segment_events) for c in calls] == [0, 0, 1, 1] and skipped == 0
    deferred = snapshot_from_data(
        sf.snapshot(
            [],
            [
                sf.entry("free_requested", BASE, 10),
                sf.entry("alloc", BASE + MIB, 10),
                sf.entry("free_completed", BASE, 10),
            ],
        )
    ).device_traces[0]
    calls, _ = plan_calls(deferred)
    assert [(c.kind, c.deferred) for c in calls] == [("free", True), ("malloc", False), ("complete", False)]


def test_rules_flag_impossible_states() -> None:
    good = snapshot_from_data(_tail_snapshot()).segments
    assert rule_violations(good, AllocatorSettings()) == (6, [])
    bad = snapshot_from_data(
        sf.snapshot(
            [
                sf.segment(BASE, [(MIB, 0, "inactive"), (MIB, 0, "inactive")], "small"),
                sf.segment(BASE + 4 * MIB, [(3 * MIB, 10, "active_allocated"), (17 * MIB, 0, "inactive")]),
            ]
        )
    ).segments
    _, problems = rule_violations(bad, AllocatorSettings())
    assert len(problems) == 2
    assert (
        "should have merged" in problems[0]
        and "large block of 3145728 B for a request of 10 B" in problems[1]
    )


def _inference_snapshot() -> dict:
    """Before the trace: A (a 16.5 MiB request handed out whole as 17 MiB) and 3 MiB free
    in one 20 MiB segment, and a free 20 MiB segment. The trace puts a 3.25 MiB request in
    the free segment: the 3 MiB block after A was too small, which only a remainder
    behind A explains. Nothing else shows where A ends, and A is freed at the end."""
    d_at, d_req = BASE + 32 * MIB, 3_407_872
    trace = [
        sf.entry("alloc", d_at, d_req, 1),
        sf.entry("free_requested", BASE, int(16.5 * MIB), 2),
        sf.entry("free_completed", BASE, int(16.5 * MIB), 3),
    ]
    segments = [
        sf.segment(BASE, [(20 * MIB, 0, "inactive")]),
        sf.segment(d_at, [(d_req, d_req, "active_allocated"), (20 * MIB - d_req, 0, "inactive")]),
    ]
    return sf.snapshot(segments, trace)


def test_replay_infers_a_remainder_from_a_best_fit_decision() -> None:
    report = replay_snapshot(snapshot_from_data(_inference_snapshot()))
    assert report.all_match, report.mismatches
    assert (report.tails, report.pinned, report.inferred, report.rounds) == (1, 0, 1, 2)


def test_rebuild_takes_a_given_end_within_bounds() -> None:
    snap = snapshot_from_data(_inference_snapshot())
    trace = snap.device_traces[0]
    (tail,) = rebuild_start(snap.segments, trace, AllocatorSettings()).tails
    assert (tail.low, tail.high, tail.end, tail.how) == (
        BASE + int(16.5 * MIB),
        BASE + int(17.5 * MIB),
        tail.low,
        "assumed",
    )
    given = rebuild_start(snap.segments, trace, AllocatorSettings(), {BASE: BASE + 30 * MIB}).tails[0]
    assert (given.end, given.how) == (tail.high, "given")  # clamped to 1 MiB over the rounded request


CACHE = [{"name": "empty_cache", "filename": "/torch/cuda/memory.py", "line": 218}]
MALLOC = [{"name": "DeviceCachingAllocator::malloc", "filename": "CUDACachingAllocator.cpp", "line": 0}]
FREE = [{"name": "DeviceCachingAllocator::free", "filename": "CUDACachingAllocator.cpp", "line": 0}]


def _trace_of(allocator: Allocator, mark: int, trace: list, frames: list) -> None:
    for e in allocator.events[mark:]:
        entry = {"action": e.action, "addr": e.address, "size": e.size, "stream": e.stream, "frames": frames}
        trace.append(entry)


def _size(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.4:
        return rng.randint(1, MIB)
    if kind < 0.85:
        return rng.randint(MIB, 12 * MIB)
    return rng.randint(10 * MIB, 60 * MIB)


def _workload(seed: int, conf: str, capacity: int | None, steps: int = 300) -> tuple[Allocator, list]:
    """Random allocations (two streams), frees (some deferred), empty_cache calls, and
    out-of-memory errors on a small device; returns the allocator and its trace."""
    rng = random.Random(seed)
    a = Allocator(parse_alloc_conf(conf), capacity=capacity)
    live, pending, trace = [], [], []
    for _ in range(steps):
        mark, r = len(a.events), rng.random()
        frames = MALLOC
        if r < 0.55 or not live:
            try:
                live.append(a.malloc(_size(rng), stream=rng.choice((0, 0, 0, 5))))
            except SimulatedOutOfMemory:
                pass
        elif r < 0.9:
            address = live.pop(rng.randrange(len(live)))
            deferred = rng.random() < 0.1
            frames = FREE
            a.free(address, deferred=deferred)
            if deferred:
                pending.append(address)
        elif r < 0.97 and pending:
            address = pending.pop(0)
            if address in a.active and a.active[address].pending:  # not completed by a cache release
                a.complete_free(address)
        else:
            a.empty_cache()
            frames = CACHE
        _trace_of(a, mark, trace, frames)
    return a, trace


@pytest.mark.parametrize("seed", range(24))
def test_replay_of_random_workloads_cut_anywhere(seed: int) -> None:
    conf = ("", "max_split_size_mb:40", "roundup_power2_divisions:4", "")[seed % 4]
    capacity = 200 * MIB if seed % 4 == 3 else None
    a, trace = _workload(seed, conf, capacity)
    assert rule_violations(a.segments(), a.settings)[1] == []
    cut = random.Random(seed).randrange(len(trace))
    data = {
        "segments": [s.to_dict() for s in a.segments()],
        "device_traces": [trace[cut:]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf},
    }
    report = replay_snapshot(snapshot_from_data(data))
    assert report.all_match, (report.mismatches[:3], report.problems[:3])
    assert report.allocs.recorded == sum(1 for e in trace[cut:] if e["action"] == "alloc")


def test_a_completion_with_other_frames_was_forced_later() -> None:
    """free_requested then free_completed of the same block: at once when both carry the
    free's stack; a completion with another stack (the allocation that forced it by
    releasing the cache) means the free was deferred and belongs to that allocation."""
    free = sf.entry("free_requested", BASE, 10)
    forced = dict(sf.entry("free_completed", BASE, 10), frames=MALLOC)
    release = dict(sf.entry("segment_free", BASE, 20 * MIB), frames=MALLOC)
    new = [  # torch records the allocation's releases, forced completions and segment with its stack
        dict(sf.entry("segment_alloc", BASE + 64 * MIB, 20 * MIB), frames=MALLOC),
        dict(sf.entry("alloc", BASE + 64 * MIB, 3 * MIB), frames=MALLOC),
    ]
    calls, _ = plan_calls(snapshot_from_data(sf.snapshot([], [free, forced, release, *new])).device_traces[0])
    assert [(c.kind, c.deferred) for c in calls] == [("free", True), ("malloc", False)]
    recorded = [e.action for _, e in calls[1].segment_events]
    assert recorded == ["free_completed", "segment_free", "segment_alloc"]
    at_once = dict(sf.entry("free_completed", BASE, 10))
    calls, _ = plan_calls(snapshot_from_data(sf.snapshot([], [free, at_once])).device_traces[0])
    assert [(c.kind, c.deferred) for c in calls] == [("free", False)]


FIXTURES = sf.FIXTURES


@pytest.mark.slow
@pytest.mark.skipif(FIXTURES is None, reason="../shared/fixtures/snapshots not present")
def test_recorded_forward_pass_replays_whole_and_cut() -> None:
    snap = load_snapshot(FIXTURES / "transformer-2.7b-ctx128-forward-amp.pickle.gz")
    whole = replay_snapshot(snap)
    assert whole.all_match and (whole.allocs.matched, whole.segment_allocs.matched) == (2703, 461)
    cut = replay_snapshot(dataclasses.replace(snap, device_traces=(snap.device_traces[0][2122:],)))
    assert cut.all_match and cut.tails == cut.pinned == 8


def test_trace_cut_between_a_segment_alloc_and_its_alloc() -> None:
    """With max_split_size 20 MiB a fresh 20 MiB segment is oversize: a cached one would
    not serve a 3 MiB request, so the first allocation shows that the ring buffer dropped
    the segment_alloc just before it."""
    data = sf.snapshot(
        [sf.segment(BASE, [(3 * MIB, 3 * MIB, "active_allocated"), (17 * MIB, 0, "inactive")])],
        [sf.entry("alloc", BASE, 3 * MIB, 1)],
    )
    data["allocator_settings"] = dict(sf.SETTINGS, max_split_size=20 * MIB)
    replayed = replay(snapshot_from_data(data))
    report = replayed.report
    assert report.all_match and report.started_mid_call and report.rounds == 2
    assert report.segment_allocs.recorded == report.segment_allocs.predicted == 0
    # The figures start with the segment there, wholly free: no step outside the trace.
    assert (replayed.start_reserved, replayed.free_after(None)) == (20 * MIB, (1, 20 * MIB))
    steps = [(s.index, s.bytes, s.allocated, s.reserved) for s in replayed.steps]
    assert steps == [(0, 3 * MIB, 3 * MIB, 20 * MIB)]
    assert replayed.check.exact


def test_report_round_trips_through_dicts() -> None:
    data = _tail_snapshot()
    data["device_traces"][0][-1]["addr"] += 1024  # one mismatch, so the list is not empty
    report = replay_snapshot(snapshot_from_data(data))
    assert report.mismatches and ReplayReport.from_dict(report.to_dict()) == report


@pytest.mark.parametrize("same_stack", [False, True])
def test_releases_an_allocation_did_not_need_are_an_empty_cache(same_stack: bool) -> None:
    """Segment frees whose stack shows no ``empty_cache`` (stacks cut short, or another
    caller's) before an allocation that could not have made them: torch releases the
    cache inside ``malloc`` only after ``cudaMalloc`` failed, then allocates a segment,
    and records the releases with the allocation's stack. With another stack, or
    without a new segment, they are an ``empty_cache()`` and the segment allocated after
    them stays with the allocation."""
    cached, split, new = BASE, BASE + 2 * MIB, BASE + 64 * MIB
    trace = [sf.entry("segment_free", cached, 2 * MIB, 1, line=30)]
    if same_stack:  # served from the split segment's free rest: no new segment
        trace.append(sf.entry("alloc", split + MIB, 100, 2, line=30))
        served = sf.segment(split, [(MIB, MIB, "active_allocated"), (512, 100, "active_allocated"),
                                    (MIB - 512, 0, "inactive")], "small")  # fmt: skip
        segments = [served]
    else:  # another stack, and a new segment for the allocation
        trace += [
            sf.entry("segment_alloc", new, 2 * MIB, 2, line=31),
            sf.entry("alloc", new, 100, 2, line=31),
        ]
        segments = [
            sf.segment(split, [(MIB, MIB, "active_allocated"), (MIB, MIB, "active_allocated")], "small"),
            sf.segment(new, [(512, 100, "active_allocated"), (2 * MIB - 512, 0, "inactive")], "small"),
        ]
    report = replay_snapshot(snapshot_from_data(sf.snapshot(segments, trace)))
    assert report.all_match, report.mismatches
    assert (report.empty_cache_calls, report.segment_frees.matched) == (1, 1)


def _cudnn_benchmark_snapshot() -> dict:
    """The pattern of the ResNet-50 trace (``shared/fixtures/h200``): cuDNN's benchmark
    allocates a workspace, frees it and runs ``emptyCache()`` from C++, so the segment
    free carries the convolution's Python stack and no ``empty_cache`` frame; a new
    segment follows for the next allocation of the same line, which the released segment
    could have served. A later segment of torch's takes the released address."""
    conv, later, other, small = 40, 41, BASE + 64 * MIB, BASE + 128 * MIB
    half = int(19.5 * MIB)
    trace = [
        sf.entry("segment_alloc", BASE, 24 * MIB, 1, line=conv),
        sf.entry("alloc", BASE, 23 * MIB, 2, line=conv),
        sf.entry("free_requested", BASE, 23 * MIB, 3, line=conv),
        sf.entry("free_completed", BASE, 23 * MIB, 4, line=conv),
        sf.entry("segment_free", BASE, 24 * MIB, 5, line=conv),
        sf.entry("segment_alloc", other, 20 * MIB, 6, line=conv),
        sf.entry("alloc", other, half, 7, line=conv),
        sf.entry("free_requested", other, half, 8, line=later),
        sf.entry("free_completed", other, half, 9, line=later),
        sf.entry("segment_alloc", BASE, 30 * MIB, 10, line=later),
        sf.entry("alloc", BASE, 30 * MIB, 11, line=later),
        sf.entry("free_requested", BASE, 30 * MIB, 12, line=later),
        sf.entry("free_completed", BASE, 30 * MIB, 13, line=later),
    ]
    for at, size in ((other, 20 * MIB), (BASE, 30 * MIB)):
        trace.append(dict(sf.entry("segment_free", at, size, 14), frames=CACHE_FRAMES))
    trace += [sf.entry("segment_alloc", small, 2 * MIB, 15), sf.entry("alloc", small, 100, 15)]
    segments = [sf.segment(small, [(512, 100, "active_allocated"), (2 * MIB - 512, 0, "inactive")], "small")]
    return sf.snapshot(segments, trace)


def test_an_empty_cache_from_cpp_inside_a_convolution_is_replayed_as_one() -> None:
    """Before the fix the release was taken for the allocation's own, the model kept the
    segment, the device handed its address out a second time and ``empty_cache()``
    stopped on the free pool holding two blocks at one address."""
    report = replay_snapshot(snapshot_from_data(_cudnn_benchmark_snapshot()))
    assert report.all_match, report.mismatches
    assert (report.allocs.matched, report.segment_allocs.matched, report.segment_frees.matched) == (4, 4, 3)
    assert report.empty_cache_calls == 2
    assert (report.final_segments.matched, report.final_blocks.matched) == (1, 2)


def test_the_replay_device_never_hands_out_an_address_the_model_holds() -> None:
    """A model that kept a segment torch released gets a fresh address, not torch's."""
    from gpu_mem_track.allocator.calls import Call, ReplayDevice

    device = ReplayDevice()
    device.adopt(BASE, 24 * MIB)
    recorded = sf.snapshot([], [sf.entry("segment_alloc", BASE, 12 * MIB)])
    segment = snapshot_from_data(recorded).device_traces[0][0]
    device.plan(Call("malloc", 1, segment, ((0, segment),)), lambda: 0)
    address = device.malloc(12 * MIB)
    assert address is not None and address >= 1 << 60
    device.free(BASE, 24 * MIB)
    device.plan(Call("malloc", 1, segment, ((0, segment),)), lambda: 0)
    assert device.malloc(12 * MIB) == BASE


H200 = FIXTURES.parent / "h200" if FIXTURES is not None else None


@pytest.mark.skipif(
    H200 is None or not (H200 / "timm-resnet50-amp.pickle.gz").is_file(), reason="no H200 traces"
)
def test_recorded_resnet50_trace_replays_to_its_end_and_peak() -> None:
    """timm's ResNet-50 with ``cudnn.benchmark`` (63 ``empty_cache()`` calls from C++):
    every decision matched, and the peak is the recorded ``max_memory_allocated()``."""
    replayed = replay(load_snapshot(H200 / "timm-resnet50-amp.pickle.gz"), 0)
    report = replayed.report
    assert report.all_match, report.mismatches
    assert (report.allocs.matched, report.segment_frees.matched, report.empty_cache_calls) == (7049, 158, 63)
    assert max(s.allocated for s in replayed.steps) == 9_824_646_144
    assert replayed.check.exact
