"""The allocator's state as memory-snapshot segments, both ways: ``export_segments``
describes the simulated cache as ``torch.cuda.memory_snapshot()`` would, and
``load_segments`` sets an empty allocator to a recorded state (as a replay's start)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from ..snapshotfile.records import Block as BlockRecord
from ..snapshotfile.records import Segment
from .blocks import Block

if TYPE_CHECKING:
    from .blocks import Pool
    from .device import DeviceMemory
    from .records import AllocatorStats
    from .settings import AllocatorSettings

__all__ = ["CacheState", "export_segments", "load_segments"]


class CacheState(Protocol):
    """The parts of an allocator (``caching.Allocator``) its segments are read from and
    loaded into: ``active`` (handed-out and pending blocks by address), the two pools of
    free blocks, the statistics, the settings and the device."""

    active: dict[int, Block]
    small_pool: Pool
    large_pool: Pool
    stats: AllocatorStats
    settings: AllocatorSettings
    device: DeviceMemory


def _state(block: Block) -> str:
    if block.allocated:
        return "active_allocated"
    return "active_pending_free" if block.pending else "inactive"


def export_segments(allocator: CacheState, device: int = 0) -> tuple[Segment, ...]:
    """The cache as snapshot segments, in address order; an expandable segment gives
    one segment per contiguous mapped range. Frames are empty (nothing was recorded)."""
    blocks = list(allocator.active.values())
    for pool in (allocator.small_pool, allocator.large_pool):
        blocks.extend(pool.free)
    heads = [b for b in blocks if b.prev is None or not b.prev.mapped]
    return tuple(_segment(head, device) for head in sorted(heads, key=lambda b: b.address))


def _segment(head: Block, device: int) -> Segment:
    records = []
    block: Block | None = head
    while block is not None and block.mapped:
        records.append(BlockRecord(block.address, block.size, block.requested, _state(block)))
        block = block.next
    active = [r for r in records if r.state != "inactive"]
    return Segment(
        device=device,
        address=head.address,
        total_size=sum(r.size for r in records),
        allocated_size=sum(r.size for r in records if r.state == "active_allocated"),
        active_size=sum(r.size for r in active),
        requested_size=sum(r.requested_size for r in active),
        stream=head.stream,
        segment_type="small" if head.small else "large",
        is_expandable=head.expandable is not None,
        blocks=tuple(records),
    )


def load_segments(allocator: CacheState, segments: Iterable[Segment]) -> None:
    """Give an allocator that holds nothing the recorded ``segments`` (blocks, their
    states and requests) and the statistics they imply; peaks start at the current
    values. Expandable segments are refused (their unmapped ranges are not recorded)."""
    if allocator.active or len(allocator.small_pool.free) or len(allocator.large_pool.free):
        raise ValueError("load_segments needs an allocator that holds nothing")
    adopt = getattr(allocator.device, "adopt", None)
    for segment in segments:
        if segment.is_expandable:
            raise ValueError(
                f"segment {segment.address:#x} is expandable: its unmapped range is not recorded"
            )
        _load_segment(allocator, segment)
        if adopt is not None:
            adopt(segment.address, segment.total_size)


def _load_segment(allocator: CacheState, segment: Segment) -> None:
    small = segment.segment_type == "small"
    pool = allocator.small_pool if small else allocator.large_pool
    stats = allocator.stats
    stats.change("segment", small, 1)
    stats.change("reserved_bytes", small, segment.total_size)
    if segment.total_size >= allocator.settings.split_limit:
        stats.oversize_segments.increase(1)
    previous: Block | None = None
    for record in segment.blocks:
        block = Block(record.address, record.size, segment.stream, small)
        block.requested = record.requested_size
        block.splice(previous, None)
        previous = block
        _place(allocator, pool, block, record.state)
    split = len(segment.blocks) > 1
    for record in segment.blocks:
        if split and record.state == "inactive":
            stats.change("inactive_split", small, 1)
            stats.change("inactive_split_bytes", small, record.size)


def _place(allocator: CacheState, pool: Pool, block: Block, state: str) -> None:
    stats = allocator.stats
    if state == "inactive":
        pool.free.add(block)
        return
    block.allocated = state == "active_allocated"
    block.pending = not block.allocated
    allocator.active[block.address] = block
    stats.change("active", block.small, 1)
    stats.change("active_bytes", block.small, block.size)
    stats.change("requested_bytes", block.small, block.requested)
    if block.allocated:
        stats.change("allocation", block.small, 1)
        stats.change("allocated_bytes", block.small, block.size)
        if block.size >= allocator.settings.split_limit:
            stats.oversize_allocations.increase(1)
