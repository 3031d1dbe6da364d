"""The allocator's state when a recorded trace began, from a snapshot's end state.

A trace is a ring buffer, so the cache at its first event is the end state minus the
net of the trace: walking the trace backwards, an ``alloc`` removes its block, a
``free_completed`` restores a pending block and ``free_requested`` an allocated one,
a ``segment_alloc`` removes its segment and a ``segment_free`` restores it; for
expandable segments, whose mapped ranges the snapshot records as segments, a
``segment_map`` takes its range out and a ``segment_unmap`` puts it back. Free blocks
are the gaps between the live blocks of each segment (free neighbours always merge).

The one unknown is the size of a block allocated before the trace and freed in it:
the trace gives its request, hence its rounded size ``r``, but a large-pool block may
have been handed out whole with up to 1 MiB more (the unsplit remainder). While the
block lives a block starts where it ends, and large-pool blocks are over 1 MiB, so any
block start seen in ``[a + r, a + r + 1 MiB]`` during its life (a live neighbour, an
allocation in the trace before its free, the segment's end) is its end. Without such
a sighting the remainder is taken as 0 unless the caller gives the end (``ends``): the
remainder then shows only through the free block after it, whose size may decide a
later best fit, and ``replay`` infers it from such a decision.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from ..snapshotfile.records import Block, Segment, TraceEntry
from .settings import K_LARGE_BUFFER, K_SMALL_BUFFER, AllocatorSettings, round_size

__all__ = ["StartState", "Tail", "rebuild_start"]


@dataclass(frozen=True)
class Tail:
    """A live block at the start whose size the trace had to settle: it starts at
    ``address``, its rounded request ends at ``low``, it may end up to ``high``, and
    ``end`` is where it was taken to end, ``how``: ``"seen"`` (a block start seen
    there), ``"given"`` (set by the caller, e.g. inferred from a replayed decision) or
    ``"assumed"`` (no evidence: no remainder)."""

    address: int
    low: int
    high: int
    end: int
    how: str


@dataclass(frozen=True)
class StartState:
    """The cache when the trace began. ``segments``: as snapshot segments (free blocks
    carry requested_size 0, their stale value being unknown); ``tails``: the large-pool
    blocks allocated before the trace and freed in it, whose unsplit remainder had to be
    settled; ``problems``: trace events that contradict the end state (one line each);
    ``strays``: how many of them are blocks live at the start in no segment."""

    segments: tuple[Segment, ...]
    tails: tuple[Tail, ...]
    problems: tuple[str, ...]
    strays: int = 0

    def count(self, how: str) -> int:
        """How many tails were settled that way."""
        return sum(1 for t in self.tails if t.how == how)


@dataclass
class _Live:
    state: str
    request: int
    size: int | None  # None: known only from the request
    freed_at: int = -1  # index of its free_completed in the trace, -1 if none


def rebuild_start(
    segments: Sequence[Segment],
    trace: Sequence[TraceEntry],
    settings: AllocatorSettings,
    ends: dict[int, int] | None = None,
    absent: frozenset[int] = frozenset(),
) -> StartState:
    """The cache before ``trace[0]``, given the segments after its last event; ``ends``:
    where given tail blocks (by address) end, when a sighting does not settle them;
    ``absent``: segments (by address) known not to exist yet, whose ``segment_alloc``
    the cut left out."""
    problems: list[str] = []
    live = _live_at_start(segments, trace, problems)
    spans = _segments_at_start(segments, trace, problems)
    for address in absent:
        spans.pop(address, None)
    starts = sorted(spans)
    by_segment: dict[int, list[int]] = {s: [] for s in starts}
    strays = 0
    for address in live:
        i = bisect_right(starts, address) - 1
        if i < 0 or address >= starts[i] + spans[starts[i]][0]:
            problems.append(f"block {address:#x} live at the start lies in no segment")
            strays += 1
            continue
        by_segment[starts[i]].append(address)
    allocs = sorted((e.addr, i) for i, e in enumerate(trace) if e.action == "alloc")
    tails: list[Tail] = []
    out = []
    for start in starts:
        size, stream, kind = spans[start]
        addresses = sorted(by_segment[start])
        context = (live, allocs, settings, ends or {}, tails)
        out.append(_segment(start, size, stream, kind, _blocks(start, size, kind, addresses, context)))
    return StartState(tuple(out), tuple(tails), tuple(problems), strays)


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
    """Start address -> (bytes, stream, pool) of each segment (or mapped range of an
    expandable segment) before ``trace[0]``."""
    spans = {s.address: (s.total_size, s.stream, s.segment_type) for s in segments}
    for index in range(len(trace) - 1, -1, -1):
        e = trace[index]
        if e.action == "segment_alloc":
            if spans.pop(e.addr, None) is None:
                problems.append(f"event {index}: segment_alloc at {e.addr:#x} of a segment gone afterwards")
        elif e.action == "segment_free":
            kind = "small" if e.size == K_SMALL_BUFFER else "large"
            spans[e.addr] = (e.size, e.stream, kind)
        elif e.action == "segment_map" and not _unmap(spans, e.addr, e.size):
            problems.append(f"event {index}: segment_map at {e.addr:#x} of a range not mapped afterwards")
        elif e.action == "segment_unmap":
            _map(spans, e.addr, e.size, e.stream)
    return spans


def _unmap(spans: dict[int, tuple[int, int, str]], address: int, size: int) -> bool:
    """Take ``size`` bytes from ``address`` out of the mapped range holding them; whether
    one did."""
    starts = sorted(spans)
    i = bisect_right(starts, address) - 1
    if i < 0:
        return False
    start = starts[i]
    length, stream, kind = spans[start]
    if address + size > start + length:
        return False
    del spans[start]
    if address > start:
        spans[start] = (address - start, stream, kind)
    if address + size < start + length:
        spans[address + size] = (start + length - address - size, stream, kind)
    return True


def _map(spans: dict[int, tuple[int, int, str]], address: int, size: int, stream: int) -> None:
    """Add a mapped range, joined with the ranges it touches (one recorded segment)."""
    before = next((s for s, (n, _, _) in spans.items() if s + n == address), None)
    after = spans.pop(address + size, None)
    kind = after[2] if after else spans[before][2] if before is not None else "large"
    if kind == "large" and size % K_LARGE_BUFFER:
        kind = "small"  # only small-pool ranges map 2 MiB pages
    if after:
        size += after[0]
    if before is not None:
        address, size = before, size + spans[before][0]
    spans[address] = (size, stream, kind)


def _blocks(start: int, size: int, kind: str, addresses: list[int], context: tuple) -> list[Block]:
    """The segment's blocks: live ones with their sizes settled, gaps as free blocks."""
    live, allocs, settings, ends, tails = context
    end = start + size
    out: list[Block] = []
    at = start
    for k, address in enumerate(addresses):
        if address > at:
            out.append(Block(at, address - at, 0, "inactive"))
        info = live[address]
        length = info.size
        if length is None:
            length = round_size(info.request, settings)
            if kind == "large" and not settings.expandable_segments:  # those cut at 512 B
                following = addresses[k + 1] if k + 1 < len(addresses) else end
                tail = _settle(address, length, following, info, allocs, settings, ends)
                tails.append(tail)
                length = tail.end - address
        out.append(Block(address, length, info.request, info.state))
        at = address + length
    if at < end:
        out.append(Block(at, end - at, 0, "inactive"))
    return out


def _settle(address, rounded, following, info, allocs, settings, ends) -> Tail:
    low = address + rounded
    high = min(low + settings.unsplit_slack(rounded), following)
    seen = _sighting(low, high, following, info, allocs)
    if seen is not None:
        return Tail(address, low, high, seen, "seen")
    if address in ends:
        return Tail(address, low, high, min(max(ends[address], low), high), "given")
    return Tail(address, low, high, low, "assumed")


def _sighting(low: int, high: int, following: int, info: _Live, allocs) -> int | None:
    """The lowest block start seen in [low, high] while the block lived: the next live
    block or the segment's end, or an allocation in the trace before its free."""
    seen = [following] if low <= following <= high else []
    i = bisect_right(allocs, (low, -1))
    while i < len(allocs) and allocs[i][0] <= high:
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
