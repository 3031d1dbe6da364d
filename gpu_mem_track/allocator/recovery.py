"""What the allocator does when no cached block fits and memory runs short, as
``DeviceCachingAllocator::malloc`` of ``c10/cuda/CUDACachingAllocator.cpp`` does it
(PyTorch main, the version with ``try_mempool_fallback``; the same steps in torch 2.11).

After ``get_free_block`` finds nothing, ``malloc`` runs, in order:

1. ``garbage_collect_cached_blocks``, only under a memory fraction
   (``set_per_process_memory_fraction``) with ``garbage_collection_threshold`` > 0: when
   the reserved bytes pass threshold x the allowed bytes, free whole (unsplit, not
   expandable) cached blocks of the large pool whose age (calls of ``get_free_block`` on
   that pool since the block went back to it) is at least the average age, repeating
   with the new average until the excess is reclaimed or nothing more is freed;
2. ``alloc_block``: under a memory fraction it fails at once when reserved + the segment
   the request needs (``get_allocation_size``, also with expandable segments) would pass
   the allowed bytes; else ``cudaMalloc`` (or mapping pages of an expandable segment);
3. ``release_available_cached_blocks`` (only with ``max_split_size``): free the smallest
   cached oversize block of the request's stream that covers max(request,
   max_split_size), else the largest ones down from the top until they add up to it
   (blocks of expandable segments skipped); retry if that freed enough;
4. ``release_cached_blocks``: ``synchronize_and_free_events`` (frees deferred by
   ``record_stream`` complete; ``num_sync_all_streams`` + 1), then every cached segment
   with no allocated block is freed (large pool, then small; each in (stream, size,
   address) order) and every free whole page of an expandable segment unmapped (the
   segment released when nothing of it stays mapped); then ``alloc_block`` again, counted
   in ``num_alloc_retries``;
5. else ``num_ooms`` + 1 and ``OutOfMemoryError``: its figures are read after all this, so
   "reserved by PyTorch but unallocated" is the free space left in segments that still
   hold an allocated block (and, with expandable segments, partial pages).

The memory fraction counts only what the allocator reserved (``total_allocated_memory``:
cudaMalloc'd segments plus mapped pages), never the CUDA context or library handles, and
the allowed bytes are fraction x the device's total memory (a fraction of 1 removes the
limit). Not modelled: free-memory callbacks (CUDA IPC), private pools (CUDA graphs,
``MemPool``) and their fallback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .blocks import Block, Pool
    from .device import DeviceMemory
    from .records import AllocatorEvent, AllocatorStats
    from .settings import AllocatorSettings

__all__ = ["Recovery", "allowed_bytes"]


def allowed_bytes(fraction: float, total_memory: int) -> int | None:
    """``setMemoryFraction``: the bytes the allocator may reserve under ``fraction`` of a
    device of ``total_memory`` bytes (``totalGlobalMem``), truncated as C++'s cast does;
    None for a fraction of 1 (no limit). ``ValueError`` outside [0, 1], with torch's
    Python-side message (``torch.cuda.set_per_process_memory_fraction``)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    return None if fraction >= 1.0 else int(fraction * total_memory)


class Recovery:
    """The release half of the allocator (needs ``settings``, ``stats``, ``events``,
    ``device``, the pools, ``active`` and ``complete_free``/``_release_block``/
    ``_unmap_block`` from ``Allocator``). ``allowed``: the bytes the allocator may reserve
    (``allowed_memory_maximum``; None: no memory fraction set)."""

    settings: AllocatorSettings
    stats: AllocatorStats
    events: list[AllocatorEvent]
    device: DeviceMemory
    small_pool: Pool
    large_pool: Pool
    active: dict[int, Block]
    allowed: int | None

    @property
    def gc_active(self) -> bool:
        """Whether ``garbage_collection_threshold`` applies: torch applies it only under
        a memory fraction."""
        return self.allowed is not None and self.settings.garbage_collection_threshold > 0.0

    def over_allowed(self, segment: int) -> bool:
        """``alloc_block``'s fraction check: reserved + ``segment`` passes the allowed bytes."""
        return self.allowed is not None and self.reserved + segment > self.allowed  # type: ignore[attr-defined]

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks`` (see the module doc, step 1)."""
        threshold = int(self.settings.garbage_collection_threshold * self.allowed)  # type: ignore[operator]
        reserved = self.reserved  # type: ignore[attr-defined]
        if reserved <= threshold:
            return
        target, reclaimed = reserved - threshold, 0
        pool = self.large_pool
        whole = [b for b in pool.free if not b.is_split]
        total_age, count = sum(pool.free.age(b) for b in whole), len(whole)
        freed = True
        while count and freed and reclaimed < target:
            average = total_age / count
            freed = False
            for block in list(pool.free):
                if not block.is_split and block.expandable is None and pool.free.age(block) >= average:
                    freed = True
                    reclaimed += block.size
                    total_age -= pool.free.age(block)
                    count -= 1
                    self._release_block(block)  # type: ignore[attr-defined]

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int) -> bool:
        """Step 3 of the module doc. Torch assumes a non-expandable oversize block is a
        whole segment (a request under ``max_split_size`` never gets an oversize block,
        and one at least that large is never split); the model checks it."""
        limit = self.settings.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        index = pool.free.lower_bound(stream, key)
        block = pool.free.at(index)
        if block is not None and block.stream == stream and block.expandable is None:
            self._release_block(block)  # type: ignore[attr-defined]
            return True
        released = 0
        index -= 1
        while released < key:
            block = pool.free.at(index)
            if block is None or block.size < limit or block.stream != stream:
                break
            index -= 1
            if block.expandable is None:
                released += block.size
                self._release_block(block)  # type: ignore[attr-defined]
        return released >= key

    def _release_cached_blocks(self) -> None:
        """Step 4 of the module doc (``emptyCache`` too)."""
        self.stats.num_sync_all_streams += 1
        for block in [b for b in self.active.values() if b.pending]:
            self.complete_free(block.address)  # type: ignore[attr-defined]
        for pool in (self.large_pool, self.small_pool):
            to_unmap = []
            for block in pool.free:
                if block.expandable is not None:
                    to_unmap.append(block)
                elif not block.is_split:
                    self._release_block(block)  # type: ignore[attr-defined]
            for block in to_unmap:
                self._unmap_block(block, pool)  # type: ignore[attr-defined]
