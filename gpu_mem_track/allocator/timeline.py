"""What the replay (``replay``) yields per trace event, for the ``snapshot`` report:
allocated and reserved bytes after every event (``Step``), the blocks in use at the
trace's start, bounds on what unknown tails could add, the cache's free blocks after
each allocation, and how the end agrees with the recorded segments (``ReplayCheck``).

The figures are the model's: an ``alloc`` adds the block the simulated allocator handed
out for it (the request rounded, an unsplit remainder included), its ``free_requested``
takes that block back, and segment events (``segment_alloc``/``segment_free``, and
``segment_map``/``segment_unmap`` of expandable segments) add or take what torch
recorded. Where the model makes every recorded decision (``ReplayReport.all_match``),
these are torch's own ``allocated_bytes`` and ``reserved_bytes``; where it does not,
they are the model's from that event on, and ``ReplayCheck.misfits`` counts the
decisions it did not make.

A block allocated before the trace and freed in it whose unsplit tail nothing in the
trace settles (``rebuild.Tail`` ``"assumed"``) is counted without one; ``tail_bounds``
states the most such a tail could add: up to the slack the rounding allows, and
leaving the free block after it over 1 MiB, as free large blocks are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..snapshotfile.records import Segment, TraceEntry
from .settings import K_MIN_BLOCK_SIZE, K_SMALL_SIZE

if TYPE_CHECKING:
    from .caching import Allocator
    from .decisions import ReplayReport
    from .rebuild import StartState

__all__ = ["Replay", "ReplayCheck", "Step", "Timeline", "free_cache", "tail_bounds"]

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
    those whose size the replay got right; ``misfits``: recorded decisions the model did
    not make (a block placed elsewhere, a segment allocated or released otherwise, a free
    of a block it did not hold; not counted with expandable segments, whose reserved
    address range the snapshot does not record) and blocks live at the start in no
    segment;
    ``unresolved_tails``/``tail_bytes``: blocks from before the trace whose unsplit tail
    stayed unknown, and the most they could add (bytes); ``final_*_replayed`` (from the
    start state plus every event) against ``final_*_recorded`` (the segments).
    ``approximate``: expandable segments were seen, whose blocks the replay only rounds.
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
    the ``check`` against the recorded end state, ``tails``: (the most bytes its unknown
    tail could add, the trace index of its ``free_requested``) per block from before the
    trace whose tail stayed unknown, ``report``: the model's decisions against the
    record, and ``cache``: (free cached blocks, the largest one's bytes) right after each
    ``alloc`` that raised the highest allocated bytes so far, by trace index, -1 for the
    start (see ``free_after``)."""

    device: int
    start_allocated: int
    start_reserved: int
    steps: tuple[Step, ...]
    start_blocks: tuple[tuple[int, int], ...]
    check: ReplayCheck
    tails: tuple[tuple[int, int], ...] = ()
    report: ReplayReport | None = None
    cache: dict[int, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    def uncertainty(self, index: int | None) -> int:
        """The most bytes the allocated figure right after trace entry ``index`` (None:
        at the start) could be low by: the unknown tails of blocks still counted then."""
        return sum(bound for bound, freed in self.tails if index is None or freed > index)

    def free_after(self, index: int | None) -> tuple[int, int]:
        """(free cached blocks, the largest one's bytes) right after the ``alloc`` at
        trace entry ``index`` (None: at the start), if it raised the highest allocated
        bytes so far (as the peak does); pending frees are not free yet. (0, 0) where
        the replay kept no figure (other events, an alloc it could not make)."""
        return self.cache.get(-1 if index is None else index, (0, 0))

    @property
    def final_allocated(self) -> int:
        return self.steps[-1].allocated if self.steps else self.start_allocated

    @property
    def final_reserved(self) -> int:
        return self.steps[-1].reserved if self.steps else self.start_reserved


def tail_bounds(start: StartState) -> tuple[dict[int, int], int]:
    """The most each tail nothing settled (``"assumed"``) could add, by block address
    (bytes): up to the rebuild's slack, and leaving the free block after it over 1 MiB;
    then how many blocks' requests overrun the next block (misfits instead)."""
    following = {
        block.address: block.address + block.size
        for segment in start.segments
        for block in segment.blocks
        if block.state == "inactive"
    }
    bounds, misfits = {}, 0
    for tail in start.tails:
        if tail.how != "assumed":
            continue
        if tail.high < tail.low:
            misfits += 1
            continue
        gap = following.get(tail.low, tail.low) - tail.low
        bounds[tail.address] = min(gap - K_SMALL_SIZE - K_MIN_BLOCK_SIZE, tail.high - tail.low)
    return bounds, misfits


def free_cache(allocator: Allocator) -> tuple[int, int]:
    """(free cached blocks, the largest one's bytes) of the simulated cache now. The free
    blocks are ordered by (stream, size): the largest of each stream ends its run."""
    count, largest = 0, 0
    for pool in (allocator.small_pool, allocator.large_pool):
        free = pool.free
        count += len(free)
        index = len(free) - 1
        while index >= 0:
            block = free.at(index)
            largest = max(largest, block.size)
            index = free.lower_bound(block.stream, 0) - 1
    return count, largest


class Timeline:
    """Collects, call by call, the bytes each recorded event added (see the module
    docstring) from the start's ``allocated`` bytes, and the free cache after each
    allocation that raised the highest allocated bytes so far (the peak's is among
    them); ``steps`` orders them."""

    def __init__(self, allocated: int = 0) -> None:
        self.changes: list[tuple[int, TraceEntry, int]] = []
        self.cache: dict[int, tuple[int, int]] = {}
        self.allocated = self.highest = allocated

    def record(self, events: Sequence[tuple[int, TraceEntry]], block: int) -> None:
        """One call's recorded events, in trace order; ``block``: the bytes of the block
        it handed out or freed (``alloc`` and ``free_requested``)."""
        for index, entry in events:
            action = entry.action
            if index < 0:  # not in the trace (a segment the cut left out)
                continue
            if action == "alloc":
                self.changes.append((index, entry, block))
                self.allocated += block
            elif action == "free_requested":
                self.changes.append((index, entry, -block))
                self.allocated -= block
            elif action in _GROW:
                self.changes.append((index, entry, _GROW[action] * entry.size))
            elif action == "oom":
                self.changes.append((index, entry, 0))

    def keep_cache(self, index: int, allocator: Allocator) -> None:
        """After the ``alloc`` at trace entry ``index``: keep the free cache if the
        allocated bytes are the highest yet."""
        if self.allocated > self.highest:
            self.highest = self.allocated
            self.cache[index] = free_cache(allocator)

    def steps(self, allocated: int, reserved: int) -> tuple[Step, ...]:
        """The steps in trace order from the start's ``allocated`` and ``reserved`` bytes."""
        out = []
        for index, entry, change in sorted(self.changes, key=lambda c: c[0]):
            if entry.action in _GROW:
                reserved += change
            else:
                allocated += change
            out.append(Step(index, entry, change, allocated, reserved))
        return tuple(out)


def replay_check(
    recorded: Sequence[Segment],
    simulated: Sequence[Segment],
    allocated_in_trace: set[int],
    final: tuple[int, int],
    unknown: tuple[int, int, int],
    approximate: bool,
) -> ReplayCheck:
    """The end of the replay against the recorded segments. ``final``: the replay's
    allocated and reserved bytes at the end; ``unknown``: misfits, unresolved tails and
    what they could add."""
    live = {s.address: [(b.address, b.size) for b in s.blocks if b.state != "inactive"] for s in simulated}
    sizes = {b.address: b.size for s in simulated for b in s.blocks if b.state != "inactive"}
    matching = checked = right = 0
    for segment in recorded:
        want = [(b.address, b.size) for b in segment.blocks if b.state != "inactive"]
        matching += want == live.get(segment.address, [])
        for block in segment.blocks:
            if block.state == "active_allocated" and block.address in allocated_in_trace:
                checked += 1
                right += sizes.get(block.address) == block.size
    misfits, unresolved, tail_bytes = unknown
    return ReplayCheck(
        segments=len(recorded),
        segments_matching=matching,
        blocks_checked=checked,
        blocks_matching=right,
        misfits=misfits,
        unresolved_tails=unresolved,
        tail_bytes=tail_bytes,
        final_allocated_replayed=final[0],
        final_allocated_recorded=sum(s.allocated_size for s in recorded),
        final_reserved_replayed=final[1],
        final_reserved_recorded=sum(s.total_size for s in recorded),
        approximate=approximate,
    )
