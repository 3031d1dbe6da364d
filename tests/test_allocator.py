"""The caching-allocator simulator: each rule against hand-computed expectations (from
c10/cuda/CUDACachingAllocator.cpp's constants), torch's own roundup oracles, settings
parsing, expandable segments, and the trace replay on small hand-built snapshots."""

from __future__ import annotations

import random

import pytest
import snapshotfiles as sf

from gpu_mem_track.allocator import (
    Allocator,
    AllocatorSettings,
    SimulatedOutOfMemory,
    parse_alloc_conf,
    round_size,
    settings_from_snapshot,
)
from gpu_mem_track.errors import UsageError
from gpu_mem_track.snapshotfile import snapshot_from_data

MIB = 2**20


def _layout(allocator: Allocator) -> list[list[tuple[int, int, str]]]:
    """Each segment's blocks as (offset from the segment, size, state)."""
    return [[(b.address - s.address, b.size, b.state) for b in s.blocks] for s in allocator.segments()]


def _segment_events(allocator: Allocator) -> list[tuple[str, int]]:
    return [(e.action, e.size) for e in allocator.events if e.action.startswith("segment")]


@pytest.mark.parametrize(
    ("request_size", "segment", "block", "pool"),
    [
        (1, 2 * MIB, 512, "small"),
        (512, 2 * MIB, 512, "small"),
        (MIB, 2 * MIB, MIB, "small"),
        (MIB + 1, 20 * MIB, MIB + 512, "large"),  # split: 20 MiB - 1 MiB - 512 B stays cached
        (int(9.9 * MIB), 20 * MIB, 10_381_312, "large"),  # 10,380,902 B rounded to 512 B
        (10 * MIB, 10 * MIB, 10 * MIB, "large"),  # not under 10 MiB: its own segment
        (25 * MIB, 26 * MIB, 26 * MIB, "large"),  # 1 MiB remainder is not over 1 MiB: handed out whole
    ],
)
def test_segment_and_block_sizes(request_size: int, segment: int, block: int, pool: str) -> None:
    a = Allocator()
    address = a.malloc(request_size)
    (seg,) = a.segments()
    assert (seg.total_size, seg.segment_type, seg.address) == (segment, pool, address)
    assert seg.blocks[0].size == block and a.allocated == block
    assert (a.reserved, a.requested) == (segment, request_size)
    assert _segment_events(a) == [("segment_alloc", segment)]


def test_small_pool_packs_blocks_into_one_segment() -> None:
    a = Allocator()
    first, second, third = a.malloc(512), a.malloc(513), a.malloc(100)
    assert (second - first, third - second) == (512, 1024)
    assert _layout(a) == [
        [(0, 512, "active_allocated"), (512, 1024, "active_allocated"), (1536, 512, "active_allocated")]
        + [(2048, 2 * MIB - 2048, "inactive")]
    ]


def test_large_split_only_when_remainder_over_1_mib() -> None:
    a = Allocator()
    a.malloc(19 * MIB)  # 20 MiB segment, 1 MiB remainder: handed out whole
    a.malloc(17 * MIB - 512)  # 18 MiB segment, 1 MiB + 512 B remainder: split off and cached
    assert _layout(a) == [
        [(0, 20 * MIB, "active_allocated")],
        [(0, 17 * MIB - 512, "active_allocated"), (17 * MIB - 512, MIB + 512, "inactive")],
    ]
    assert a.allocated == 20 * MIB + 17 * MIB - 512


def test_split_then_reuse_remainder() -> None:
    a = Allocator()
    x = a.malloc(4 * MIB)
    y = a.malloc(4 * MIB)
    assert y == x + 4 * MIB
    assert _layout(a) == [
        [
            (0, 4 * MIB, "active_allocated"),
            (4 * MIB, 4 * MIB, "active_allocated"),
            (8 * MIB, 12 * MIB, "inactive"),
        ]
    ]
    assert a.reserved == 20 * MIB and a.stats.get("inactive_split").current == 1


def test_free_blocks_merge_with_free_neighbours() -> None:
    a = Allocator()
    x, y, z = (a.malloc(4 * MIB) for _ in range(3))
    a.free(y)
    assert [s for _, s, st in _layout(a)[0] if st == "inactive"] == [4 * MIB, 8 * MIB]
    assert a.stats.get("inactive_split").current == 2
    a.free(x)  # merges with y's block
    assert _layout(a)[0][:2] == [(0, 8 * MIB, "inactive"), (8 * MIB, 4 * MIB, "active_allocated")]
    a.free(z)  # merges both ways: the whole segment again
    assert _layout(a) == [[(0, 20 * MIB, "inactive")]]
    assert a.stats.get("inactive_split").current == 0 and a.allocated == 0 and a.reserved == 20 * MIB


def test_best_fit_by_size() -> None:
    a = Allocator()
    x = a.malloc(8 * MIB)
    a.malloc(12 * MIB)  # takes the 12 MiB remainder of x's segment whole
    a.malloc(8 * MIB)  # a new segment, leaving a free 12 MiB block in it
    a.free(x)  # free blocks now: 8 MiB (x) and 12 MiB
    assert a.malloc(7 * MIB) == x  # the smallest block that fits
    assert a.allocated == 8 * MIB + 12 * MIB + 8 * MIB  # 1 MiB remainder: handed out whole


def test_equal_sizes_go_to_the_lower_address() -> None:
    a = Allocator()
    first = a.malloc(10 * MIB)
    second = a.malloc(10 * MIB)
    a.free(second)
    a.free(first)
    assert a.malloc(10 * MIB) == min(first, second)


def test_blocks_are_reused_only_on_their_stream() -> None:
    a = Allocator()
    x = a.malloc(4 * MIB, stream=7)
    a.free(x)
    y = a.malloc(4 * MIB, stream=0)
    assert y != x and _segment_events(a) == [("segment_alloc", 20 * MIB)] * 2
    assert a.malloc(4 * MIB, stream=7) == x  # back on stream 7: the cached block
    assert {s.stream for s in a.segments()} == {0, 7}


def test_max_split_size_oversize_blocks() -> None:
    a = Allocator(parse_alloc_conf("max_split_size_mb:40"))
    big = a.malloc(50 * MIB)
    a.free(big)
    small = a.malloc(4 * MIB)  # under max_split_size: may not take the 50 MiB oversize block
    assert small != big and a.reserved == 70 * MIB
    assert a.malloc(45 * MIB) == big  # oversize request within 20 MiB of the block: reused whole
    assert a.allocated == 4 * MIB + 50 * MIB
    assert a.stats.oversize_allocations.current == 1 and a.stats.oversize_segments.current == 1


def test_max_split_size_rounding_limit() -> None:
    a = Allocator(parse_alloc_conf("max_split_size_mb:40"))
    big = a.malloc(62 * MIB)
    a.free(big)
    assert a.malloc(41 * MIB) != big  # 62 MiB >= 41 + 20 MiB: not reused, its own 42 MiB segment
    assert _segment_events(a) == [("segment_alloc", 62 * MIB), ("segment_alloc", 42 * MIB)]


def test_oversize_blocks_are_not_split() -> None:
    a = Allocator(parse_alloc_conf("max_split_size_mb:40"))
    a.malloc(45 * MIB - 512)  # 46 MiB segment, remainder over 1 MiB, but the block is oversize
    assert _layout(a) == [[(0, 46 * MIB, "active_allocated")]]


def test_max_split_size_releases_oversize_blocks_first() -> None:
    a = Allocator(parse_alloc_conf("max_split_size_mb:40"), capacity=100 * MIB)
    a.free(a.malloc(50 * MIB))
    a.free(a.malloc(4 * MIB))  # a cached 20 MiB segment besides the 50 MiB one
    a.malloc(60 * MIB)  # 70 + 60 > 100: release the oversize 50 MiB (not enough), then everything
    assert _segment_events(a)[2:] == [
        ("segment_free", 50 * MIB),
        ("segment_free", 20 * MIB),
        ("segment_alloc", 60 * MIB),
    ]
    assert a.stats.num_alloc_retries == 1 and a.reserved == 60 * MIB


@pytest.mark.parametrize(
    ("conf", "allocated"),
    [
        ("", 88_080_384),
        ("roundup_power2_divisions:4", 100_663_296),
        ("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", 92_274_688),
    ],
)
def test_torch_roundup_oracles(conf: str, allocated: int) -> None:
    """test/test_cuda.py: torch.rand(21 * 2**20) (88,080,384 B) under each setting."""
    a = Allocator(parse_alloc_conf(conf))
    a.malloc(21 * 2**20 * 4)
    assert (a.allocated, a.requested) == (allocated, 88_080_384)


def test_round_size_rules() -> None:
    four = parse_alloc_conf("roundup_power2_divisions:4")
    assert [round_size(n) for n in (0, 1, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]
    assert round_size(1200, four) == 1536  # not over 512 B x 4 divisions: 512 B rounding
    assert round_size(9000, four) == 10240  # 8192 + a quarter of 8192, not 9216
    assert round_size(8192, four) == 8192  # powers of two stay


def test_parse_alloc_conf() -> None:
    s = parse_alloc_conf(" max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6 ")
    assert (s.max_split_size, s.expandable_segments, s.garbage_collection_threshold) == (128 * MIB, True, 0.6)
    table = parse_alloc_conf(
        "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]"
    ).roundup_power2_divisions
    assert table == (8,) * 7 + (2, 2, 2, 1, 1, 1, 1, 1, 1)
    assert parse_alloc_conf("").conf_string() == "" and parse_alloc_conf(
        "max_split_size_mb:64"
    ).conf_string() == ("max_split_size_mb:64")


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ("max_split_size_mb:10", "at least 20"),
        ("max_split_size_mb:big", "needs a number"),
        ("roundup_power2_divisions:3", "power of 2"),
        ("expandable_segments:yes", "True or False"),
        ("colour:blue", "unknown option 'colour'"),
        ("backend:cudaMallocAsync", "only the native"),
        ("max_split_size_mb", "expected ':'"),
    ],
)
def test_bad_alloc_conf(conf: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_alloc_conf(conf)


def test_settings_from_snapshot() -> None:
    assert settings_from_snapshot(sf.SETTINGS) == AllocatorSettings()
    data = dict(sf.SETTINGS, max_split_size=256 * MIB, expandable_segments=True)
    data["roundup_power2_divisions"] = dict(data["roundup_power2_divisions"], **{"64": 8, "128": 2})
    s = settings_from_snapshot(data)
    assert (s.max_split_size, s.expandable_segments) == (256 * MIB, True)
    assert s.divisions_for(100 * MIB) == 8 and s.divisions_for(200 * MIB) == 2
    assert settings_from_snapshot({}) == AllocatorSettings()


def test_oom_retry_after_releasing_the_cache() -> None:
    a = Allocator(capacity=30 * MIB)
    a.free(a.malloc(4 * MIB))  # a cached 20 MiB segment
    a.malloc(25 * MIB)  # 20 + 26 > 30: release the cache, retry
    assert _segment_events(a) == [
        ("segment_alloc", 20 * MIB),
        ("segment_free", 20 * MIB),
        ("segment_alloc", 26 * MIB),
    ]
    assert (a.reserved, a.stats.num_alloc_retries, a.device.used) == (26 * MIB, 1, 26 * MIB)


def test_out_of_memory_when_nothing_can_be_released() -> None:
    a = Allocator(capacity=30 * MIB)
    a.malloc(4 * MIB)  # its segment stays: a block in it is allocated
    with pytest.raises(SimulatedOutOfMemory, match="tried to allocate 26214400 B") as info:
        a.malloc(25 * MIB)
    assert (info.value.allocated, info.value.reserved) == (4 * MIB, 20 * MIB)
    assert a.events[-1].action == "oom" and a.stats.num_ooms == 1
    assert a.reserved == 20 * MIB  # state untouched


def test_empty_cache_releases_segments_without_allocated_blocks() -> None:
    a = Allocator()
    keep = a.malloc(4 * MIB)
    a.malloc(4 * MIB)
    small = a.malloc(512)
    other = a.malloc(30 * MIB)
    lone = a.malloc(14 * MIB)  # its own segment: the free 12 MiB block is too small
    for address in (other, lone, small):
        a.free(address)
    a.empty_cache()
    # large pool first, in size order, then the small pool; the split segment stays
    assert _segment_events(a)[-3:] == [
        ("segment_free", 14 * MIB),
        ("segment_free", 30 * MIB),
        ("segment_free", 2 * MIB),
    ]
    assert a.reserved == 20 * MIB and a.allocated == 8 * MIB
    a.free(keep)
    a.empty_cache()
    assert a.reserved == 20 * MIB  # one block still allocated in that segment


def test_deferred_free_holds_the_block() -> None:
    a = Allocator()
    x = a.malloc(4 * MIB)
    a.free(x, deferred=True)
    assert a.allocated == 0 and a.stats.get("active_bytes").current == 4 * MIB
    assert _layout(a)[0][0] == (0, 4 * MIB, "active_pending_free")
    assert a.malloc(4 * MIB) == x + 4 * MIB  # the pending block is not reused
    a.complete_free(x)
    assert a.malloc(4 * MIB) == x
    with pytest.raises(KeyError):
        a.free(12345)


def test_stats_use_torch_names_and_peaks() -> None:
    a = Allocator()
    x = a.malloc(3 * MIB)
    a.free(x)
    a.malloc(1000)
    stats = a.memory_stats()
    assert stats["allocated_bytes.all.peak"] == 3 * MIB
    assert stats["allocated_bytes.all.current"] == 1024
    assert stats["requested_bytes.large_pool.allocated"] == 3 * MIB
    assert stats["reserved_bytes.all.current"] == 22 * MIB
    assert stats["segment.small_pool.current"] == 1 and stats["num_device_alloc"] == 2
    assert a.largest_free_block() == 20 * MIB


def test_expandable_segments_map_pages() -> None:
    a = Allocator(parse_alloc_conf("expandable_segments:True"), capacity=80 * 2**30)
    addresses = [a.malloc(3 * MIB) for _ in range(7)]
    assert [y - x for x, y in zip(addresses, addresses[1:])] == [3 * MIB] * 6  # contiguous across pages
    assert _segment_events(a) == [("segment_map", 20 * MIB), ("segment_map", 20 * MIB)]
    assert a.reserved == 40 * MIB and len(a.segments()) == 1 and a.segments()[0].is_expandable
    big = a.malloc(25 * MIB)  # split at 512 B granularity: exactly 25 MiB, pages mapped as needed
    assert a.allocated == 21 * MIB + 25 * MIB and a.reserved == 60 * MIB
    for address in (*addresses, big):
        a.free(address)
    a.empty_cache()
    assert a.reserved == 0 and _segment_events(a)[-1] == ("segment_unmap", 60 * MIB)


def test_expandable_small_pool_pages_are_2_mib() -> None:
    a = Allocator(parse_alloc_conf("expandable_segments:True"))
    a.malloc(512)
    assert _segment_events(a) == [("segment_map", 2 * MIB)] and a.reserved == 2 * MIB


def test_expandable_out_of_memory() -> None:
    a = Allocator(parse_alloc_conf("expandable_segments:True"), capacity=40 * MIB)
    a.malloc(30 * MIB)
    with pytest.raises(SimulatedOutOfMemory):
        a.malloc(30 * MIB)


def test_from_segments_round_trip_and_stats() -> None:
    base = sf.BASE
    data = sf.snapshot(
        [
            sf.segment(base, [(4 * MIB, 4_000_000, "active_allocated"), (16 * MIB, 0, "inactive")]),
            sf.segment(
                base + 32 * MIB, [(512, 100, "active_pending_free"), (2 * MIB - 512, 0, "inactive")], "small"
            ),
        ]
    )
    segments = snapshot_from_data(data).segments
    a = Allocator.from_segments(segments)
    assert [[(b.address, b.size, b.state) for b in s.blocks] for s in a.segments()] == [
        [(b.address, b.size, b.state) for b in s.blocks] for s in segments
    ]
    assert (a.allocated, a.reserved, a.requested) == (4 * MIB, 22 * MIB, 4_000_100)
    assert a.stats.get("inactive_split").current == 2 and a.stats.get("active").current == 2
    assert a.malloc(4 * MIB) == base + 4 * MIB  # the cached remainder serves the next request
    a.complete_free(base + 32 * MIB)
    assert a.requested == 4_000_000 + 4 * MIB
    expandable = dict(data["segments"][0], is_expandable=True)
    with pytest.raises(ValueError, match="expandable"):
        Allocator.from_segments(snapshot_from_data(sf.snapshot([expandable])).segments)


@pytest.mark.parametrize("seed", range(6))
def test_expandable_segments_stay_consistent(seed: int) -> None:
    """Random allocations and frees on two streams with expandable segments: the mapped
    ranges are tiled by blocks, free neighbours merged, the statistics agree with the
    blocks, and freeing everything then emptying the cache unmaps every page."""
    rng = random.Random(seed)
    a = Allocator(parse_alloc_conf("expandable_segments:True"), capacity=400 * MIB)
    live = []
    for _ in range(300):
        if rng.random() < 0.6 or not live:
            size = rng.choice((rng.randint(1, MIB), rng.randint(MIB, 30 * MIB)))
            try:
                live.append(a.malloc(size, stream=rng.choice((0, 3))))
            except SimulatedOutOfMemory:
                pass
        else:
            a.free(live.pop(rng.randrange(len(live))))
        if rng.random() < 0.05:
            a.empty_cache()
        segments = a.segments()
        blocks = [b for s in segments for b in s.blocks]
        assert a.reserved == sum(s.total_size for s in segments) == a.device.used <= 400 * MIB
        assert a.allocated == sum(b.size for b in blocks if b.state == "active_allocated")
        for s in segments:
            assert s.total_size % (2 * MIB if s.segment_type == "small" else 20 * MIB) == 0
            states = [b.state for b in s.blocks]
            assert all(x != "inactive" or y != "inactive" for x, y in zip(states, states[1:]))
    for address in live:
        a.free(address)
    a.empty_cache()
    assert a.reserved == 0 and a.segments() == () and a.device.used == 0
