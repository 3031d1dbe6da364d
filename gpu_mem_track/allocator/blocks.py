"""Blocks and the ordered sets that hold the free ones.

A segment is a doubly linked list of ``Block``s tiling it in address order. Free
blocks of a pool are kept ordered by (stream, size, address), so the best fit for a
request is the first block at or after (stream, request size); unmapped ranges of
expandable segments by (stream, address), so the lowest one comes first.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

__all__ = ["Block", "ExpandableSegment", "FreeBlocks", "Pool", "UnmappedBlocks"]


class ExpandableSegment:
    """A reserved virtual address range of ``size`` bytes from ``base`` whose pages of
    ``page`` bytes are mapped to physical memory as needed."""

    __slots__ = ("base", "size", "page", "stream")

    def __init__(self, base: int, size: int, page: int, stream: int) -> None:
        self.base, self.size, self.page, self.stream = base, size, page, stream


class Block:
    """A piece of a segment: ``size`` bytes from ``address`` on ``stream``, in the small
    or large pool. ``allocated``: handed out; ``pending``: freed by the program but held
    until other streams' work ends (torch's ``active_pending_free``). ``requested``: the
    last request served (torch keeps it after the free). ``expandable``: its expandable
    segment (None for a ``cudaMalloc`` segment); ``mapped``: False for an unmapped range.
    ``gc_base``: its pool's ``FreeBlocks.calls`` when it last went into the free set
    (torch's ``gc_count_base``)."""

    __slots__ = (
        "address",
        "size",
        "stream",
        "small",
        "requested",
        "allocated",
        "pending",
        "mapped",
        "prev",
        "next",
        "expandable",
        "gc_base",
    )

    def __init__(
        self, address: int, size: int, stream: int, small: bool, expandable: ExpandableSegment | None = None
    ) -> None:
        self.address = address
        self.size = size
        self.stream = stream
        self.small = small
        self.requested = 0
        self.allocated = False
        self.pending = False
        self.mapped = True
        self.prev: Block | None = None
        self.next: Block | None = None
        self.expandable = expandable
        self.gc_base = 0

    @property
    def is_split(self) -> bool:
        """Whether the block shares its segment with others."""
        return self.prev is not None or self.next is not None

    @property
    def reusable(self) -> bool:
        """Free and not waiting on other streams: it may merge or be handed out."""
        return not self.allocated and not self.pending

    def splice(self, before: Block | None, after: Block | None) -> None:
        """Link this block between ``before`` and ``after`` (neighbours until now)."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "pending" if self.pending else "free"
        return f"Block({self.address:#x}, {self.size}, stream={self.stream}, {state})"


class FreeBlocks:
    """Free (mapped) blocks of one pool, ordered by (stream, size, address). ``calls``:
    the searches of this pool while ``garbage_collection_threshold`` applies (torch's
    ``get_free_blocks_call_count``); a block's ``age`` is the searches since it was added
    (``insert_into_blocks`` / ``gc_count``)."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int, int]] = []
        self._blocks: dict[int, Block] = {}
        self.calls = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[Block]:
        blocks = self._blocks
        return iter([blocks[k[2]] for k in self._keys])

    def add(self, block: Block) -> None:
        insort(self._keys, (block.stream, block.size, block.address))
        self._blocks[block.address] = block
        block.gc_base = self.calls

    def age(self, block: Block) -> int:
        """Searches of this pool since ``block`` was added."""
        return self.calls - block.gc_base

    def remove(self, block: Block) -> None:
        key = (block.stream, block.size, block.address)
        i = bisect_left(self._keys, key)
        if i == len(self._keys) or self._keys[i] != key:
            raise AssertionError(f"{block!r} is not in the free set")
        del self._keys[i]
        del self._blocks[block.address]

    def get(self, address: int) -> Block | None:
        """The free block starting at ``address``, if any."""
        return self._blocks.get(address)

    def lower_bound(self, stream: int, size: int) -> int:
        """Index of the first block ordered at or after (stream, size, 0)."""
        return bisect_left(self._keys, (stream, size, 0))

    def at(self, index: int) -> Block | None:
        """The block at ``index`` in order (None past the end)."""
        if index < 0 or index >= len(self._keys):
            return None
        return self._blocks[self._keys[index][2]]


class UnmappedBlocks:
    """Unmapped ranges of expandable segments, ordered by (stream, address)."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, Block] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, block: Block) -> None:
        insort(self._keys, (block.stream, block.address))
        self._blocks[block.address] = block

    def remove(self, block: Block) -> None:
        key = (block.stream, block.address)
        i = bisect_left(self._keys, key)
        if i == len(self._keys) or self._keys[i] != key:
            raise AssertionError(f"{block!r} is not in the unmapped set")
        del self._keys[i]
        del self._blocks[block.address]

    def from_stream(self, stream: int) -> list[Block]:
        """This stream's unmapped ranges, lowest address first."""
        i = bisect_left(self._keys, (stream, 0))
        out = []
        while i < len(self._keys) and self._keys[i][0] == stream:
            out.append(self._blocks[self._keys[i][1]])
            i += 1
        return out


class Pool:
    """One block pool: the small (requests <= 1 MiB) or the large one."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free = FreeBlocks()
        self.unmapped = UnmappedBlocks()
