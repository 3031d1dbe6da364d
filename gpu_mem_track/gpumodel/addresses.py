"""Where the CUDA driver places the caching allocator's segments: each new one below the
ones before.

The caching allocator picks, among free blocks of the size it needs, the one at the
lowest address (its pools are ordered by stream, size, address). So which of two equal
free blocks serves a request, and what stays free around it, depends on where
``cudaMalloc`` put their segments. In recorded snapshots the driver hands out large
segments top-down: of the segments of 32 MiB or more, each one lies below the one made
before it in 18 of 23 (nanogpt-char), 15 of 18 (nanogpt-gpt2-bf16, H200, torch 2.11;
``../shared/fixtures/h200``), 97 of 98 and 359 of 360 (the 2.7B transformer traces,
``../shared/fixtures/snapshots``). Ascending addresses made the simulated GPT-2 step
put its bf16 log-softmax into the older of two free 2.3 GiB segments where the GPU used
the newer one, and end with one 2.3 GiB segment more (+15% reserved).

Modelled: every segment below all earlier ones, 2 MiB aligned, never reused. Not
modelled: the driver fills gaps with small segments (2 and 20 MiB ones land in the
holes of its larger reservations), and addresses are never recycled after
``cudaFree``.
"""

from __future__ import annotations

from ..allocator.device import SimulatedDevice

__all__ = ["TopDownDevice"]

_ALIGN = 2 << 20


class TopDownDevice(SimulatedDevice):
    """A :class:`~gpu_mem_track.allocator.device.SimulatedDevice` of ``capacity`` bytes
    whose ``cudaMalloc`` (and virtual reservations) return addresses below ``top``,
    each new one below all earlier ones (see the module doc)."""

    def __init__(self, capacity: int | None = None, top: int = 0x7FFF_0000_0000) -> None:
        super().__init__(capacity)
        self._top = top

    def _address(self, size: int) -> int:
        self._top -= -(-size // _ALIGN) * _ALIGN
        return self._top
