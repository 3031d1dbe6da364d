"""A simulation of PyTorch's CUDA caching allocator (``DeviceCachingAllocator`` in
``c10/cuda/CUDACachingAllocator.cpp``) for one device, in pure Python.

``malloc`` rounds the request (``settings.round_size``), picks the pool (small: <= 1 MiB),
and takes the best-fitting free block of that pool and stream, ordered by (stream, size,
address), unless the oversize rules forbid it (``max_split_size``). When none fits it
asks the device for a segment (``allocation_size``); when memory runs short (the device
is full, or the memory fraction's limit is reached) it recovers as torch does
(``recovery``: garbage collection under a fraction, the oversize release, the release
of every cached segment and free expandable page, one retry), then raises
``SimulatedOutOfMemory``. The block is split when
the remainder is worth keeping (small pool or expandable segments: >= 512 B; large
pool: request under ``max_split_size`` and remainder over 1 MiB), else handed out whole.
A freed block merges with free neighbours in its segment. ``empty_cache`` releases every
segment that holds no allocated block.

Every decision is logged in ``events`` (``AllocatorEvent``, named as in a snapshot's
trace), and ``stats`` keeps torch's statistics (``memory_stats()``).
Not modelled: CUDA graph private pools and ``MemPool``s, free-memory callbacks, IPC.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .blocks import Block, Pool
from .device import DeviceMemory, SimulatedDevice
from .expandable import ExpandableSegments
from .records import AllocatorEvent, AllocatorStats, SimulatedOutOfMemory
from .recovery import Recovery, allowed_bytes
from .settings import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, AllocatorSettings, allocation_size, round_size
from .state import export_segments, load_segments

if TYPE_CHECKING:
    from ..snapshotfile.records import Segment

__all__ = ["Allocator"]


class Allocator(ExpandableSegments, Recovery):
    """One device's caching allocator.

    ``settings``: the allocator settings (defaults if None); ``capacity``: the device's
    bytes (None: unlimited) for the default ``SimulatedDevice``; ``device``: any
    ``DeviceMemory`` instead (then ``capacity`` is ignored); ``total_memory``: the GPU's
    whole memory (``totalGlobalMem``), which sizes an expandable segment's address range
    (None: the capacity).
    """

    def __init__(
        self,
        settings: AllocatorSettings | None = None,
        capacity: int | None = None,
        device: DeviceMemory | None = None,
        total_memory: int | None = None,
    ) -> None:
        self.settings = settings or AllocatorSettings()
        self.total_memory = total_memory
        self.device: DeviceMemory = device if device is not None else SimulatedDevice(capacity)
        self.small_pool = Pool(small=True)
        self.large_pool = Pool(small=False)
        self.active: dict[int, Block] = {}
        self.stats = AllocatorStats()
        self.events: list[AllocatorEvent] = []
        self.allowed: int | None = None

    # -- the public calls ------------------------------------------------------------

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes for ``stream``; returns the block's address (0 for
        0 bytes, as torch does without touching the cache). Raises
        ``SimulatedOutOfMemory`` when the device cannot supply a segment."""
        if size < 0:
            raise ValueError(f"cannot allocate {size} bytes")
        if size == 0:
            return 0
        rounded = round_size(size, self.settings)
        pool = self.small_pool if rounded <= K_SMALL_SIZE else self.large_pool
        block = self._get_free_block(pool, stream, rounded)
        if block is None:
            block = self._new_block(pool, stream, rounded)
        if block is None:
            self.stats.num_ooms += 1
            self.events.append(AllocatorEvent("oom", 0, rounded, stream))
            raise SimulatedOutOfMemory(rounded, self.allocated, self.reserved, self.limit, self.allowed)
        return self._hand_out(block, pool, stream, rounded, size)

    def set_memory_fraction(self, fraction: float, total_memory: int) -> None:
        """``set_per_process_memory_fraction``: from now on the allocator may reserve at
        most ``fraction`` x ``total_memory`` bytes (the device's whole memory, the CUDA
        context not counted against it); a fraction of 1 removes the limit. The device's
        own capacity still applies (see ``recovery``)."""
        self.allowed = allowed_bytes(fraction, total_memory)

    @property
    def limit(self) -> int | None:
        """The most the allocator can reserve: the device's capacity, or the memory
        fraction's allowed bytes when lower (None: unlimited)."""
        limits = [n for n in (self.device.capacity, self.allowed) if n is not None]
        return min(limits) if limits else None

    def free(self, address: int, deferred: bool = False) -> None:
        """Free the block at ``address``. ``deferred``: it was used on other streams
        (``record_stream``), so it stays unusable (``active_pending_free``) until
        ``complete_free``."""
        block = self.active.get(address)
        if block is None or not block.allocated:
            raise KeyError(f"no allocated block at {address:#x}")
        block.allocated = False
        self.stats.change("allocation", block.small, -1)
        self.stats.change("allocated_bytes", block.small, -block.size)
        self.events.append(AllocatorEvent("free_requested", address, block.requested, block.stream))
        if block.size >= self.settings.split_limit:
            self.stats.oversize_allocations.decrease(1)
        if deferred:
            block.pending = True
        else:
            self._free_block(block)

    def complete_free(self, address: int) -> None:
        """The other streams' work on a deferred free has ended: the block is reusable."""
        block = self.active.get(address)
        if block is None or not block.pending:
            raise KeyError(f"no block awaiting its free at {address:#x}")
        block.pending = False
        self._free_block(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: complete pending frees, then release every
        cached segment that holds no allocated block (large pool first, each pool in
        (stream, size, address) order)."""
        self._release_cached_blocks()

    @classmethod
    def from_segments(
        cls,
        segments: Iterable[Segment],
        settings: AllocatorSettings | None = None,
        capacity: int | None = None,
        device: DeviceMemory | None = None,
    ) -> Allocator:
        """An allocator holding the recorded ``segments`` (one device's), as the start
        of a replay; the statistics' peaks start at the current values."""
        allocator = cls(settings, capacity, device)
        load_segments(allocator, segments)
        return allocator

    def segments(self, device: int = 0) -> tuple[Segment, ...]:
        """The cache as ``torch.cuda.memory_snapshot()`` segments, in address order."""
        return export_segments(self, device)

    # -- figures ---------------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """``memory_allocated()``: bytes of allocated blocks (whole blocks, not requests)."""
        return self.stats.get("allocated_bytes").current

    @property
    def reserved(self) -> int:
        """``memory_reserved()``: bytes of all segments (mapped pages for expandable ones)."""
        return self.stats.get("reserved_bytes").current

    @property
    def requested(self) -> int:
        """Bytes asked for by the live (or pending) allocations."""
        return self.stats.get("requested_bytes").current

    def memory_stats(self) -> dict[str, int]:
        """The statistics under ``torch.cuda.memory_stats()`` names."""
        return self.stats.as_dict()

    def largest_free_block(self) -> int:
        """The largest cached free block (bytes), 0 if none."""
        sizes = [b.size for pool in (self.small_pool, self.large_pool) for b in pool.free]
        return max(sizes, default=0)

    # -- malloc's steps --------------------------------------------------------------

    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        if self.gc_active:
            pool.free.calls += 1  # get_free_blocks_call_count: the blocks' age
        index = pool.free.lower_bound(stream, size)
        block = pool.free.at(index)
        if block is None or block.stream != stream:
            return None
        if block.expandable is not None:
            block = self._expandable_fit(pool, stream, index)
            if block is None:
                return None
        limit = self.settings.split_limit
        if size < limit <= block.size:
            return None
        if size >= limit and block.size >= size + self.settings.max_non_split_rounding_size:
            return None
        pool.free.remove(block)
        return block

    def _new_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        """``malloc``'s steps after ``get_free_block`` found nothing (``recovery``)."""
        if self.gc_active:
            self._garbage_collect()
        block = self._alloc_block(pool, stream, size, retry=False)
        if block is None and self._release_available_cached_blocks(pool, stream, size):
            block = self._alloc_block(pool, stream, size, retry=False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_block(pool, stream, size, retry=True)
        return block

    def _alloc_block(self, pool: Pool, stream: int, size: int, retry: bool) -> Block | None:
        if retry:
            self.stats.num_alloc_retries += 1
        segment = allocation_size(size)
        if self.over_allowed(segment):
            return None
        if self.settings.expandable_segments:
            return self._allocate_expandable(pool, stream, size)
        address = self.device.malloc(segment)
        if address is None:
            return None
        self.stats.change("segment", pool.small, 1)
        self.stats.change("reserved_bytes", pool.small, segment)
        if segment >= self.settings.split_limit:
            self.stats.oversize_segments.increase(1)
        self.stats.num_device_alloc += 1
        self.events.append(AllocatorEvent("segment_alloc", address, segment, stream))
        return Block(address, segment, stream, pool.small)

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.settings.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.settings.split_limit and remaining > K_SMALL_SIZE

    def _hand_out(self, block: Block, pool: Pool, stream: int, size: int, request: int) -> int:
        already_split = block.is_split
        counts_split = block.expandable is None
        if self._should_split(block, size):
            remaining = block
            block = Block(remaining.address, size, stream, pool.small, remaining.expandable)
            block.splice(remaining.prev, remaining)
            remaining.address += size
            remaining.size -= size
            pool.free.add(remaining)
            if counts_split and already_split:
                self.stats.change("inactive_split_bytes", pool.small, -size)
            elif counts_split:
                self.stats.change("inactive_split_bytes", pool.small, remaining.size)
                self.stats.change("inactive_split", pool.small, 1)
        elif counts_split and already_split:
            self.stats.change("inactive_split_bytes", pool.small, -block.size)
            self.stats.change("inactive_split", pool.small, -1)
        block.allocated = True
        block.requested = request
        self.active[block.address] = block
        self.events.append(AllocatorEvent("alloc", block.address, request, block.stream))
        for name, amount in (
            ("allocation", 1),
            ("allocated_bytes", block.size),
            ("active", 1),
            ("active_bytes", block.size),
            ("requested_bytes", request),
        ):
            self.stats.change(name, pool.small, amount)
        if block.size >= self.settings.split_limit:
            self.stats.oversize_allocations.increase(1)
        return block.address

    # -- freeing ---------------------------------------------------------------------

    def _free_block(self, block: Block) -> None:
        self.events.append(AllocatorEvent("free_completed", block.address, block.requested, block.stream))
        del self.active[block.address]
        pool = self.small_pool if block.small else self.large_pool
        size, requested = block.size, block.requested
        net_blocks = net_bytes = 0
        for neighbour in (block.prev, block.next):
            subsumed = self._merge(block, neighbour, pool)
            if subsumed:
                net_blocks -= 1
                net_bytes -= subsumed
        pool.free.add(block)
        if block.is_split:
            net_blocks += 1
            net_bytes += block.size
        if block.expandable is None:
            if net_blocks:
                self.stats.change("inactive_split", block.small, net_blocks)
            if net_bytes:
                self.stats.change("inactive_split_bytes", block.small, net_bytes)
        self.stats.change("active", block.small, -1)
        self.stats.change("active_bytes", block.small, -size)
        self.stats.change("requested_bytes", block.small, -requested)

    @staticmethod
    def _merge(dst: Block, src: Block | None, pool: Pool) -> int:
        """Merge the free neighbour ``src`` into ``dst``; the bytes gained (0 if not)."""
        if src is None or not src.reusable or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            pool.free.remove(src)
        else:
            pool.unmapped.remove(src)
        if dst.prev is src:
            dst.address = src.address
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # -- releasing segments ----------------------------------------------------------

    def _release_block(self, block: Block) -> None:
        if block.is_split or block.expandable is not None:
            raise AssertionError(f"{block!r} is not a whole cudaMalloc segment")
        pool = self.small_pool if block.small else self.large_pool
        pool.free.remove(block)
        self.stats.num_device_free += 1
        self.events.append(AllocatorEvent("segment_free", block.address, block.size, block.stream))
        self.device.free(block.address, block.size)
        self.stats.change("segment", block.small, -1)
        self.stats.change("reserved_bytes", block.small, -block.size)
        if block.size >= self.settings.split_limit:
            self.stats.oversize_segments.decrease(1)
