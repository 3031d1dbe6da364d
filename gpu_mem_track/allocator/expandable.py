"""Expandable segments (``expandable_segments:True``): per stream and pool, one large
reserved address range whose pages (2 MiB in the small pool, 20 MiB in the large one)
are mapped as allocations need them and unmapped when ``empty_cache`` (or an
allocation that found memory short, ``recovery``) releases the cache. ``reserved`` counts mapped
pages only. Mixed into ``Allocator``; the rules follow ``find_expandable_block``,
``map_block``, ``try_allocate_expandable_block`` and ``unmap_block`` of torch's source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .blocks import Block, ExpandableSegment, Pool
from .records import AllocatorEvent
from .settings import K_LARGE_BUFFER, K_SMALL_BUFFER

if TYPE_CHECKING:
    from .device import DeviceMemory
    from .records import AllocatorStats

__all__ = ["DEFAULT_ADDRESS_SPACE", "ExpandableSegments"]

#: Address space reserved per expandable segment when the device's capacity is
#: unknown (torch reserves 1 1/8 of the GPU's memory): 80 GiB plus an eighth.
DEFAULT_ADDRESS_SPACE = 90 * 2**30


class ExpandableSegments:
    """The expandable-segment half of the allocator (needs ``device``, ``stats``,
    ``events``, ``settings`` and ``_merge`` from ``Allocator``)."""

    device: DeviceMemory
    stats: AllocatorStats
    events: list[AllocatorEvent]
    total_memory: int | None

    def _expandable_fit(self, pool: Pool, stream: int, index: int) -> Block | None:
        """Best fit when the first candidate lies in an expandable segment: with the
        setting on, a free block's size counts the unmapped range after it; with it
        off (turned off later), expandable blocks are skipped."""
        block = pool.free.at(index)
        if not self.settings.expandable_segments:  # type: ignore[attr-defined]
            while block is not None and block.expandable is not None and block.stream == stream:
                index += 1
                block = pool.free.at(index)
            return block if block is not None and block.stream == stream else None
        following = pool.free.at(index + 1)
        while (
            block.expandable is not None
            and following is not None
            and following.stream == stream
            and _expandable_size(following) < _expandable_size(block)
        ):
            index += 1
            block, following = following, pool.free.at(index + 1)
        return block

    def _allocate_expandable(self, pool: Pool, stream: int, size: int) -> Block | None:
        candidate = self._find_expandable_block(pool, stream, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size), pool):
            return None
        while candidate.size < size:
            following = candidate.next
            if following is None or not self._map_block(
                following, min(size - candidate.size, following.size), pool
            ):
                return None
            candidate = following
        pool.free.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: Pool, stream: int, size: int) -> Block:
        """The lowest-addressed run of free and unmapped blocks with ``size`` bytes of
        room in this stream's segments, else a new segment's whole unmapped range."""
        for candidate in pool.unmapped.from_stream(stream):
            if candidate.prev is not None and candidate.prev.reusable:
                candidate = candidate.prev
            room, block = 0, candidate
            while room < size and block is not None and block.reusable:
                room += block.size
                block = block.next
            if room >= size:
                return candidate
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        total = self.total_memory or self.device.capacity or DEFAULT_ADDRESS_SPACE * 8 // 9
        pages = -(-(total + total // 8) // page)  # totalGlobalMem + 1/8, not what is free
        base = self.device.reserve(pages * page)
        segment = ExpandableSegment(base, pages * page, page, stream)
        candidate = Block(base, pages * page, stream, pool.small, segment)
        candidate.mapped = False
        pool.unmapped.add(candidate)
        return candidate

    def _map_block(self, block: Block, size: int, pool: Pool) -> bool:
        segment = block.expandable
        begin = (block.address - segment.base) // segment.page
        end = -(-(block.address + size - segment.base) // segment.page)
        mapped = (end - begin) * segment.page
        if mapped == 0 or not self.device.map(mapped):
            return False
        address = block.address
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(address + mapped, block.size - mapped, block.stream, block.small, segment)
            rest.mapped = False
            rest.splice(block, block.next)
            pool.unmapped.add(rest)
            block.size = mapped
        self._merge(block, block.prev, pool)  # type: ignore[attr-defined]
        self._merge(block, block.next, pool)  # type: ignore[attr-defined]
        pool.free.add(block)
        self.stats.change("reserved_bytes", pool.small, mapped)
        self.stats.num_device_alloc += 1
        self.events.append(AllocatorEvent("segment_map", address, mapped, block.stream))
        return True

    def _unmap_block(self, block: Block, pool: Pool) -> None:
        """Unmap the whole pages inside the free ``block``; release its segment if
        nothing of it stays mapped."""
        segment = block.expandable
        begin = -(-(block.address - segment.base) // segment.page)
        end = (block.address + block.size - segment.base) // segment.page
        if begin >= end:
            return
        pool.free.remove(block)
        start, length = segment.base + begin * segment.page, (end - begin) * segment.page
        if start > block.address:
            before = Block(block.address, start - block.address, block.stream, block.small, segment)
            before.splice(block.prev, block)
            pool.free.add(before)
        after = block.address + block.size - (start + length)
        if after > 0:
            tail = Block(start + length, after, block.stream, block.small, segment)
            tail.splice(block, block.next)
            pool.free.add(tail)
        block.address, block.size, block.mapped = start, length, False
        self._merge(block, block.prev, pool)  # type: ignore[attr-defined]
        self._merge(block, block.next, pool)  # type: ignore[attr-defined]
        pool.unmapped.add(block)
        self.device.unmap(length)
        self.stats.change("reserved_bytes", pool.small, -length)
        self.stats.num_device_free += 1
        self.events.append(AllocatorEvent("segment_unmap", start, length, block.stream))
        if block.prev is None and block.next is None:
            pool.unmapped.remove(block)
            self.device.release(segment.base, segment.size)


def _expandable_size(block: Block) -> int:
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)
