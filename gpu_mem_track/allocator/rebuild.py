"""The allocator's state when a recorded trace began, from a snapshot's end state.

A trace is a ring buffer, so the cache at its first event is the end state minus the
net of the trace: walking the trace backwards, an ``alloc`` removes its block, a
``free_completed`` restores a pending block and ``free_requested`` an allocated one,
a ``segment_alloc`` removes its segment and a ``segment_free`` restores it. Free blocks
are the gaps between the live blocks of each segment (free neighbours always merge).

The one unknown is the size of a block allocated before the trace and freed in it:
the trace gives its request, hence its rounded size ``r``, but a large-pool block may
have been handed out whole with up to 1 MiB more (the unsplit remainder). While the
block lives a block starts where it ends, and large-pool blocks are over 1 MiB, so any
block start seen in ``[a + r, a + r + 1 MiB]`` during its life (a live neighbour, an
allocation in the trace before its free, the segment's end) is its end. Without such
a sighting the remainder cannot have mattered to where later blocks went; it is taken
as 0 and counted as unpinned.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from ..snapshots.records import Block, Segment, TraceEntry
from .settings import K_ROUND_LARGE, K_SMALL_BUFFER, K_SMALL_SIZE, AllocatorSettings, round_size

__all__ = ["StartState", "rebuild_start"]


@dataclass(frozen=True)
class StartState:
    """The cache when the trace began. ``segments``: as snapshot segments (free blocks
    carry requested_size 0, their stale value being unknown); ``tails``: live blocks
    whose size the trace had to pin down (large pool, allocated before the trace and
    freed in it); ``pinned``: how many of them a sighting fixed; ``problems``: trace
    events that contradict the end state (each one line)."""

    segments: tuple[Segment, ...]
    tails: int
    pinned: int
    problems: tuple[str, ...]


@dataclass
class _Live:
    state: str
    request: int
    size: int | None  # None: known only from the request
    freed_at: int = -1  # index of its free_completed in the trace, -1 if none


def rebuild_start(
    segments: Sequence[Segment], trace: Sequence[TraceEntry], settings: AllocatorSettings
) -> StartState:
    """The cache before ``trace[0]``, given the segments after its last event."""
    problems: list[str] = []
    live = _live_at_start(segments, trace, problems)
    spans = _segments_at_start(segments, trace, problems)
    starts = sorted(spans)
    by_segment: dict[int, list[int]] = {s: [] for s in starts}
    for address in live:
        i = bisect_right(starts, address) - 1
        if i < 0 or address >= starts[i] + spans[starts[i]][0]:
            problems.append(f"block {address:#x} live at the start lies in no segment")
            continue
        by_segment[starts[i]].append(address)
    allocs = sorted((e.addr, i) for i, e in enumerate(trace) if e.action == "alloc")
    tails = pinned = 0
    out = []
    for start in starts:
        size, stream, kind = spans[start]
        addresses = sorted(by_segment[start])
        blocks, t, p = _blocks(start, size, kind, addresses, live, allocs, settings)
        tails, pinned = tails + t, pinned + p
        out.append(_segment(start, size, stream, kind, blocks))
    return StartState(tuple(out), tails, pinned, tuple(problems))


def _live_at_start(segments: Sequence[Segment], trace: Sequence[TraceEntry], problems: list[str]) -> dict:
    live = {
        b.address: _Live(b.state, b.requested_size, b.size)
        for s in segments
        for b in s.blocks
        if b.state != "inactive"
    }
    for index in range(len(trace) - 1, -1, -1):
        e = trace[index]
        if e.action == "alloc":
            if live.pop(e.addr, None) is None:
                problems.append(f"event {index}: alloc at {e.addr:#x} of a block not live afterwards")
        elif e.action == "free_completed":
            if e.addr in live:
                problems.append(f"event {index}: free_completed at {e.addr:#x} of a live block")
            live[e.addr] = _Live("active_pending_free", e.size, None, index)
        elif e.action == "free_requested":
            block = live.get(e.addr)
            if block is None:  # completed after the snapshot: still pending at the end
                problems.append(f"event {index}: free_requested at {e.addr:#x} without its completion")
                continue
            block.state = "active_allocated"
    return live


def _segments_at_start(
    segments: Sequence[Segment], trace: Sequence[TraceEntry], problems: list[str]
) -> dict[int, tuple[int, int, str]]:
    spans = {s.address: (s.total_size, s.stream, s.segment_type) for s in segments}
    for index in range(len(trace) - 1, -1, -1):
        e = trace[index]
        if e.action == "segment_alloc":
            if spans.pop(e.addr, None) is None:
                problems.append(f"event {index}: segment_alloc at {e.addr:#x} of a segment gone afterwards")
        elif e.action == "segment_free":
            kind = "small" if e.size == K_SMALL_BUFFER else "large"
            spans[e.addr] = (e.size, e.stream, kind)
    return spans


def _tail_limit(rounded: int, settings: AllocatorSettings) -> int:
    if rounded < settings.split_limit:
        return K_SMALL_SIZE
    return max(settings.max_non_split_rounding_size, K_ROUND_LARGE)


def _blocks(start, size, kind, addresses, live, allocs, settings):
    """The segment's blocks: live ones with their sizes settled, gaps as free blocks;
    also the number of unknown tails and of those pinned."""
    end = start + size
    out: list[Block] = []
    at = start
    tails = pinned = 0
    for k, address in enumerate(addresses):
        if address > at:
            out.append(Block(at, address - at, 0, "inactive"))
        info = live[address]
        length = info.size
        if length is None:
            length = round_size(info.request, settings)
            if kind == "large":
                tails += 1
                nxt = addresses[k + 1] if k + 1 < len(addresses) else end
                seen = _sighting(address + length, _tail_limit(length, settings), nxt, end, info, allocs)
                if seen is not None:
                    pinned += 1
                    length = seen - address
        out.append(Block(address, length, info.request, info.state))
        at = address + length
    if at < end:
        out.append(Block(at, end - at, 0, "inactive"))
    return out, tails, pinned


def _sighting(low: int, limit: int, following: int, end: int, info: _Live, allocs) -> int | None:
    """The lowest block start seen in [low, low + limit] while the block lived."""
    seen = [x for x in (following, end) if low <= x <= low + limit]
    i = bisect_right(allocs, (low, -1))
    while i < len(allocs) and allocs[i][0] <= low + limit:
        address, index = allocs[i]
        if info.freed_at < 0 or index < info.freed_at:
            seen.append(address)
            break
        i += 1
    return min(seen) if seen else None


def _segment(address: int, size: int, stream: int, kind: str, blocks: list[Block]) -> Segment:
    active = [b for b in blocks if b.state != "inactive"]
    return Segment(
        device=0,
        address=address,
        total_size=size,
        allocated_size=sum(b.size for b in blocks if b.state == "active_allocated"),
        active_size=sum(b.size for b in active),
        requested_size=sum(b.requested_size for b in active),
        stream=stream,
        segment_type=kind,
        blocks=tuple(blocks),
    )
