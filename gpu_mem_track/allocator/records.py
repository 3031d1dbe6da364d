"""What the simulated allocator reports: its events, its statistics, and the error it
raises when the device is full. Plain data; the allocator (``caching``) fills them in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["POOLS", "STAT_NAMES", "AllocatorEvent", "AllocatorStats", "SimulatedOutOfMemory", "Stat"]

#: Torch's per-pool statistic families (``torch.cuda.memory_stats`` key prefixes).
STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
#: Torch's counters (``memory_stats()`` keys without a pool).
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
#: The pools a statistic is kept for: all of them, the small pool, the large pool.
POOLS = ("all", "small_pool", "large_pool")


@dataclass(frozen=True)
class AllocatorEvent:
    """One thing the allocator did, named as in a memory snapshot's trace: ``alloc``,
    ``free_requested``, ``free_completed`` (``size`` = the request), ``segment_alloc``,
    ``segment_free``, ``segment_map``, ``segment_unmap`` (``size`` = the segment or the
    mapped range), ``oom`` (``address`` 0, ``size`` = the rounded request)."""

    action: str
    address: int
    size: int
    stream: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "address": self.address, "size": self.size, "stream": self.stream}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AllocatorEvent:
        return cls(data["action"], int(data["address"]), int(data["size"]), int(data.get("stream", 0)))


class Stat:
    """One statistic as torch keeps it: ``current``, ``peak``, and the running totals
    ``allocated`` (all increases) and ``freed`` (all decreases)."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount


class AllocatorStats:
    """The allocator's statistics, named as ``torch.cuda.memory_stats()`` names them."""

    def __init__(self) -> None:
        self.families = {name: {pool: Stat() for pool in POOLS} for name in STAT_NAMES}
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_sync_all_streams = 0

    def change(self, name: str, small: bool, amount: int) -> None:
        """Add ``amount`` (may be negative) to ``name`` for all pools and for one pool."""
        pool = "small_pool" if small else "large_pool"
        stats = self.families[name]
        for stat in (stats["all"], stats[pool]):
            if amount >= 0:
                stat.increase(amount)
            else:
                stat.decrease(-amount)

    def get(self, name: str, pool: str = "all") -> Stat:
        return self.families[name][pool]

    def as_dict(self) -> dict[str, int]:
        """Flat ``family.pool.metric`` keys as torch returns them, plus the counters."""
        out: dict[str, int] = {}
        for name, pools in self.families.items():
            for pool, stat in pools.items():
                for metric in Stat.__slots__:
                    out[f"{name}.{pool}.{metric}"] = getattr(stat, metric)
        for name in ("oversize_allocations", "oversize_segments"):
            for metric in Stat.__slots__:
                out[f"{name}.{metric}"] = getattr(getattr(self, name), metric)
        for name in COUNTERS:
            out[name] = getattr(self, name)
        return out


class SimulatedOutOfMemory(RuntimeError):
    """The simulated device could not supply a segment even after the cache was
    released: torch would raise ``torch.OutOfMemoryError`` here. ``size``: the rounded
    request; ``allocated`` and ``reserved``: the allocator's bytes after the release;
    ``capacity``: the most it could reserve (the device's capacity, or the memory
    fraction's limit when lower; None: unlimited); ``allowed``: the memory fraction's
    limit (None: none set)."""

    def __init__(
        self, size: int, allocated: int, reserved: int, capacity: int | None, allowed: int | None = None
    ) -> None:
        self.size, self.allocated, self.reserved, self.capacity = size, allocated, reserved, capacity
        self.allowed = allowed
        cap = "unlimited" if capacity is None else f"{capacity} B"
        super().__init__(
            f"simulated CUDA out of memory: tried to allocate {size} B with {allocated} B allocated, "
            f"{reserved} B reserved, device capacity {cap}"
        )
