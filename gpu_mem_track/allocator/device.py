"""The device memory under the allocator: what ``cudaMalloc``/``cudaFree`` and the
virtual-memory calls (reserve, map, unmap) would do. ``SimulatedDevice`` hands out
fresh addresses and fails once ``capacity`` bytes are in use; a replay substitutes a
device that answers as the recorded GPU did (see ``replay``)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["DeviceMemory", "SimulatedDevice"]

_ALIGN = 2 << 20


class DeviceMemory(Protocol):
    """What the allocator asks of the device. ``malloc`` returns an address or None
    when the device is full; ``map`` returns whether ``size`` more physical bytes were
    available. ``capacity``: total bytes (None: unlimited); ``used``: bytes in use."""

    capacity: int | None

    @property
    def used(self) -> int: ...

    def malloc(self, size: int) -> int | None: ...

    def free(self, address: int, size: int) -> None: ...

    def reserve(self, size: int) -> int: ...

    def release(self, address: int, size: int) -> None: ...

    def map(self, size: int) -> bool: ...

    def unmap(self, size: int) -> None: ...


class SimulatedDevice:
    """A device of ``capacity`` bytes (None: unlimited) whose ``cudaMalloc`` returns
    2 MiB-aligned addresses from ``base`` upwards, never reused; ``reserve`` takes
    virtual address space only, ``map`` physical bytes only."""

    def __init__(self, capacity: int | None = None, base: int = 0x7F00_0000_0000) -> None:
        self.capacity = capacity
        self._next = base
        self._used = 0

    @property
    def used(self) -> int:
        return self._used

    def _fits(self, size: int) -> bool:
        return self.capacity is None or self._used + size <= self.capacity

    def _address(self, size: int) -> int:
        address = self._next
        self._next += -(-size // _ALIGN) * _ALIGN
        return address

    def malloc(self, size: int) -> int | None:
        if not self._fits(size):
            return None
        self._used += size
        return self._address(size)

    def free(self, address: int, size: int) -> None:
        self._used -= size

    def adopt(self, address: int, size: int) -> None:
        """Count a segment that exists already (a start state) as in use."""
        self._used += size
        self._next = max(self._next, address + -(-size // _ALIGN) * _ALIGN)

    def reserve(self, size: int) -> int:
        return self._address(size)

    def release(self, address: int, size: int) -> None:
        return None

    def map(self, size: int) -> bool:
        if not self._fits(size):
            return False
        self._used += size
        return True

    def unmap(self, size: int) -> None:
        self._used -= size
