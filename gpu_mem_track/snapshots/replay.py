"""Replay a snapshot's trace: allocated and reserved bytes after every event, counted as
the caching allocator counts them.

The trace's ``alloc`` and free entries carry the *request*, but ``allocated_bytes`` grows
by the *block*: the request rounded up to 512 B (or to a power-of-two division with
``roundup_power2_divisions``), and in the large pool (blocks over 1 MiB) the whole free
block when cutting it would leave 1 MiB or less (or when the request is at least
``max_split_size``). Which block that was follows from the addresses: a free block runs
from where it starts to the next block in use (free neighbours are always merged), so
replaying which address ranges are in use gives every block's size exactly, and frees
subtract what the matching ``alloc`` added. ``allocated_bytes`` drops at
``free_requested``; the range is reusable after ``free_completed``.

The trace is a ring buffer, so the state at its start is worked out backwards from the
segments at the end, by the allocator model's one start-state rebuild
(``allocator.rebuild.rebuild_start``, whose docstring states the method). A block
allocated before the trace and freed in it has a known request but, in the large pool,
possibly an unsplit tail: the rebuild pins it where a block start is seen (the next
block in use within the slack, or an allocation landing there while the block lives).
A tail nothing pins is taken as none, as the rebuild does, and counted here as
unresolved: ``ReplayCheck.tail_bytes`` bounds what such tails could add (the slack, and
leaving the free block after each over 1 MiB, as free large blocks are). On the recorded
fixtures (``scripts/check_snapshots.py``) the replay taken this way is exact after every
event of every ring-buffer cut, and ``scripts/check_allocator.py`` matches every decision.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..allocator.rebuild import StartState, rebuild_start
from ..allocator.settings import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorSettings,
    round_size,
    settings_from_snapshot,
)
from ..snapshotfile.records import Segment, Snapshot, TraceEntry

__all__ = ["Replay", "ReplayCheck", "Step", "free_blocks_at", "replay"]

_GROW = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass(frozen=True, slots=True)
class Step:
    """One event that changed allocated or reserved bytes (or an ``oom``): ``index`` in
    the device's trace, the ``entry``, ``bytes`` it added (negative: removed; the block
    for allocations and frees, the segment or range for segment events), and
    ``allocated``/``reserved`` after it."""

    index: int
    entry: TraceEntry
    bytes: int
    allocated: int
    reserved: int


@dataclass(frozen=True)
class ReplayCheck:
    """How well the replay agrees with the segments recorded at the end.

    ``segments``/``segments_matching``: segments at the end, and those whose blocks in use
    the replay reproduces exactly (addresses and sizes); ``blocks_checked``/
    ``blocks_matching``: blocks allocated in the trace and still in use at the end, and
    those whose size the replay got right; ``misfits``: events that did not fit the
    replayed layout (an alloc over a block in use, a free of an unknown address);
    ``unresolved_tails``/``tail_bytes``: blocks from before the trace whose unsplit tail
    stayed unknown, and the most they could add (bytes); ``final_*_replayed`` (from the
    start state plus every event) against ``final_*_recorded`` (the segments).
    ``approximate``: expandable segments were seen, whose block sizes are only rounded.
    """

    segments: int
    segments_matching: int
    blocks_checked: int
    blocks_matching: int
    misfits: int
    unresolved_tails: int
    tail_bytes: int
    final_allocated_replayed: int
    final_allocated_recorded: int
    final_reserved_replayed: int
    final_reserved_recorded: int
    approximate: bool = False

    @property
    def exact(self) -> bool:
        """Whether everything checked agrees (and nothing stayed unknown)."""
        return (
            self.segments_matching == self.segments
            and self.blocks_matching == self.blocks_checked
            and not self.misfits
            and not self.unresolved_tails
            and self.final_allocated_replayed == self.final_allocated_recorded
            and self.final_reserved_replayed == self.final_reserved_recorded
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "exact": self.exact}


@dataclass(frozen=True)
class Replay:
    """The replayed trace of one device: bytes allocated and reserved at its start,
    ``steps`` in order, ``start_blocks`` (address, block bytes) allocated at the start,
    the ``check`` against the recorded end state, and ``tails``: (the most bytes its
    unknown tail could add, the trace index of its ``free_requested``) per block from
    before the trace whose tail stayed unknown (see the module docstring)."""

    device: int
    start_allocated: int
    start_reserved: int
    steps: tuple[Step, ...]
    start_blocks: tuple[tuple[int, int], ...]
    check: ReplayCheck
    tails: tuple[tuple[int, int], ...] = ()

    def uncertainty(self, index: int | None) -> int:
        """The most bytes the allocated figure right after trace entry ``index`` (None:
        at the start) could be low by: the unknown tails of blocks still counted then."""
        return sum(bound for bound, freed in self.tails if index is None or freed > index)

    @property
    def final_allocated(self) -> int:
        return self.steps[-1].allocated if self.steps else self.start_allocated

    @property
    def final_reserved(self) -> int:
        return self.steps[-1].reserved if self.steps else self.start_reserved


def replay(snapshot: Snapshot, device: int) -> Replay:
    """Replay ``device``'s trace (empty: the end state only) as the module docstring says."""
    trace = snapshot.device_trace(device)
    segments = snapshot.device_segments(device)
    layout = _Layout.at_start(segments, trace, _settings(snapshot))
    changes, tails = [], []
    for index, entry in enumerate(trace):
        if entry.action == "free_requested" and entry.addr in layout.tails and entry.addr in layout.counted:
            tails.append((layout.tails[entry.addr], index))
        change = layout.apply(entry)
        if change is not None:
            changes.append((index, entry, change))
    # Allocations in the trace may pin the tails of blocks from before it: start from
    # the sizes known at the end of the replay.
    start_blocks = tuple(sorted(layout.start_counted.items()))
    allocated = start_allocated = sum(layout.start_counted.values())
    reserved = start_reserved = layout.start_reserved
    steps = []
    for index, entry, change in changes:
        if entry.action in _GROW:
            reserved += change
        else:
            allocated += change
        steps.append(Step(index, entry, change, allocated, reserved))
    check = layout.check(segments, allocated, reserved)
    return Replay(device, start_allocated, start_reserved, tuple(steps), start_blocks, check, tuple(tails))


def free_blocks_at(snapshot: Snapshot, device: int, index: int | None) -> list[int]:
    """Sizes (bytes) of the free cached blocks right after trace entry ``index`` (None:
    the recorded end state), largest first. Pending frees are not free yet."""
    segments = snapshot.device_segments(device)
    if index is None:
        return sorted((b.size for s in segments for b in s.blocks if b.state == "inactive"), reverse=True)
    trace = snapshot.device_trace(device)
    layout = _Layout.at_start(segments, trace, _settings(snapshot))
    for entry in trace[: index + 1]:
        layout.apply(entry)
    return layout.gaps()


def _settings(snapshot: Snapshot) -> AllocatorSettings:
    """The snapshot's allocator settings (the defaults where they cannot be read)."""
    try:
        return settings_from_snapshot(snapshot.allocator_settings)
    except (ValueError, TypeError, AttributeError, KeyError):
        return AllocatorSettings()


class _Layout:
    """Which address ranges are in use, per segment, while the trace is replayed.

    ``segments``: start address -> bytes; ``used``: per segment, the sorted start
    addresses of blocks in use; ``size``: block bytes by address; ``counted``: blocks
    counted in allocated bytes (in use and not yet free_requested), address -> bytes;
    ``start_counted``: the blocks counted at the start, with tails pinned later included;
    ``tails``: blocks from before the trace whose tail is unknown, address -> the most it
    could add (bytes).
    """

    def __init__(self, settings: AllocatorSettings) -> None:
        self.settings = settings
        self.power2 = any(d > 1 for d in settings.roundup_power2_divisions)
        self.max_split = settings.split_limit
        self.segments: dict[int, int] = {}
        self.starts: list[int] = []
        self.used: dict[int, list[int]] = {}
        self.size: dict[int, int] = {}
        self.counted: dict[int, int] = {}
        self.start_counted: dict[int, int] = {}
        self.start_reserved = 0
        self.tails: dict[int, int] = {}
        self.trace_allocated: set[int] = set()
        self.misfits = 0
        self.unresolved = 0
        self.tail_bytes = 0
        self.expandable = False

    @classmethod
    def at_start(
        cls, segments: Sequence[Segment], trace: Sequence[TraceEntry], settings: AllocatorSettings
    ) -> _Layout:
        """The layout when the trace began, from the allocator's one start-state rebuild
        (``allocator.rebuild.rebuild_start``): it settles every unsplit tail a block start
        pins; a tail nothing pins is taken as none and bounded here (``tails``)."""
        layout = cls(settings)
        layout.expandable = any(s.is_expandable for s in segments) or any(
            e.action in ("segment_map", "segment_unmap") for e in trace
        )
        start = rebuild_start(segments, trace, settings)
        layout.misfits += start.strays
        layout.segments = {s.address: s.total_size for s in start.segments}
        layout.starts = sorted(layout.segments)
        for segment in start.segments:
            live = [b for b in segment.blocks if b.state != "inactive"]
            layout.used[segment.address] = [b.address for b in live]
            layout.size.update((b.address, b.size) for b in live)
            layout.counted.update((b.address, b.size) for b in live if b.state == "active_allocated")
        layout.bound_tails(start)
        layout.start_counted = dict(layout.counted)
        layout.start_reserved = sum(layout.segments.values())
        return layout

    def bound_tails(self, start: StartState) -> None:
        """The most each tail nothing pinned could add: up to the rebuild's slack, and
        leaving the free block after it over 1 MiB (free large blocks are); a block whose
        request overruns the next block is a misfit instead."""
        following = {
            block.address: block.address + block.size
            for segment in start.segments
            for block in segment.blocks
            if block.state == "inactive"
        }
        for tail in start.tails:
            if tail.how != "assumed":
                continue
            if tail.high < tail.low:
                self.misfits += 1
                continue
            gap = following.get(tail.low, tail.low) - tail.low
            self.tails[tail.address] = min(gap - K_SMALL_SIZE - K_MIN_BLOCK_SIZE, tail.high - tail.low)

    def segment_of(self, addr: int) -> int | None:
        i = bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        start = self.starts[i]
        return start if addr < start + self.segments[start] else None

    def apply(self, entry: TraceEntry) -> int | None:
        """Replay one entry; the bytes it adds to allocated or reserved (None: neither)."""
        action, addr = entry.action, entry.addr
        if action == "alloc":
            return self.alloc(addr, entry.size)
        if action == "free_requested":
            size = self.counted.pop(addr, None)
            if size is None:
                self.misfits += 1
                size = self.size.get(addr, round_size(entry.size, self.settings))
            return -size
        if action == "free_completed":
            self.release(addr)
            return None
        if action in _GROW:
            self.segment_event(action, addr, entry.size)
            return _GROW[action] * entry.size
        return 0 if action == "oom" else None

    def alloc(self, addr: int, request: int) -> int:
        if self.power2:
            rounded = round_size(request, self.settings)
        else:
            unit = K_MIN_BLOCK_SIZE
            rounded = unit if request < unit else -(-request // unit) * unit
        segment = self.segment_of(addr)
        size = rounded
        if segment is not None and not self.expandable:
            addresses = self.used[segment]
            i = bisect_right(addresses, addr)
            if i:
                self.pin(addresses[i - 1], addr)
            end = addresses[i] if i < len(addresses) else segment + self.segments[segment]
            free = end - addr
            if free < rounded:
                self.misfits += 1
            elif self.segments[segment] != K_SMALL_BUFFER and not self.splits(rounded, free):
                size = free
            addresses.insert(i, addr)
        elif segment is None:
            self.misfits += 1
        else:
            insort(self.used[segment], addr)
        self.size[addr] = self.counted[addr] = size
        self.trace_allocated.add(addr)
        return size

    def splits(self, rounded: int, free: int) -> bool:
        """Whether the allocator cuts a large free block of ``free`` bytes for ``rounded``."""
        if rounded >= self.max_split:
            return False
        return free - rounded > K_SMALL_SIZE

    def pin(self, before: int, addr: int) -> None:
        """An allocation at ``addr`` right after a block whose tail was unknown fixes it."""
        tail = self.tails.pop(before, None)
        if tail is None:
            return
        end = before + self.size[before]
        if end <= addr <= end + K_SMALL_SIZE:
            self.size[before] = addr - before
            for sizes in (self.counted, self.start_counted):
                if before in sizes:
                    sizes[before] = addr - before
        elif addr < end:
            self.misfits += 1

    def release(self, addr: int) -> None:
        segment = self.segment_of(addr)
        addresses = self.used.get(segment) if segment is not None else None
        i = bisect_right(addresses, addr) - 1 if addresses else -1
        if addresses is None or i < 0 or addresses[i] != addr:
            self.misfits += 1
            return
        del addresses[i]
        tail = self.tails.pop(addr, None)
        if tail is not None:
            self.unresolved += 1
            self.tail_bytes += tail

    def segment_event(self, action: str, addr: int, size: int) -> None:
        if action == "segment_alloc":
            self.segments[addr] = size
            insort(self.starts, addr)
            self.used[addr] = []
        elif action == "segment_free":
            if self.segments.pop(addr, None) is None or self.used.pop(addr, None):
                self.misfits += 1
            if addr in self.starts:
                self.starts.remove(addr)
        else:
            self.expandable = True

    def gaps(self) -> list[int]:
        """Free bytes between blocks in use, per segment, largest first."""
        out = []
        for start, addresses in self.used.items():
            at = start
            for addr in addresses:
                if addr > at:
                    out.append(addr - at)
                at = max(at, addr + self.size.get(addr, 0))
            end = start + self.segments[start]
            if end > at:
                out.append(end - at)
        return sorted(out, reverse=True)

    def check(self, segments: Sequence[Segment], allocated: int, reserved: int) -> ReplayCheck:
        matching = checked = right = 0
        for segment in segments:
            want = [(b.address, b.size) for b in segment.blocks if b.state != "inactive"]
            got = [(a, self.size.get(a)) for a in self.used.get(segment.address, [])]
            matching += want == got
            for block in segment.blocks:
                if block.state == "active_allocated" and block.address in self.trace_allocated:
                    checked += 1
                    right += self.size.get(block.address) == block.size
        unresolved = self.unresolved + len(self.tails)
        tail_bytes = self.tail_bytes + sum(self.tails.values())
        return ReplayCheck(
            segments=len(segments),
            segments_matching=matching,
            blocks_checked=checked,
            blocks_matching=right,
            misfits=self.misfits,
            unresolved_tails=unresolved,
            tail_bytes=tail_bytes,
            final_allocated_replayed=allocated,
            final_allocated_recorded=sum(s.allocated_size for s in segments),
            final_reserved_replayed=reserved,
            final_reserved_recorded=sum(s.total_size for s in segments),
            approximate=self.expandable,
        )
