"""What the parts that stand in for CUDA need of a running simulated GPU.

:class:`~gpu_mem_track.simgpu.session.SimulatedGpu` builds the GPU and hands itself to
the ``torch.cuda`` API (:mod:`~gpu_mem_track.simgpu.cudaapi`), the snapshot
(:mod:`~gpu_mem_track.simgpu.snapshot`) and the fake process group
(:mod:`~gpu_mem_track.simgpu.ranks`); they see it through :class:`RunningGpu`, so none of
them imports the session that installs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..allocator import Allocator
    from .catalog import GpuSpec
    from .engine import GpuMemory, Storages

__all__ = ["RunningGpu"]


class RunningGpu(Protocol):
    """A simulated GPU while its session runs: ``spec`` (the GPU), ``memory`` (the device
    memory storages are taken from), ``allocator`` (its caching-allocator model),
    ``storages`` (the storage tracker) and :meth:`note_skipped_save`."""

    spec: GpuSpec
    memory: GpuMemory
    allocator: Allocator
    storages: Storages

    def note_skipped_save(self) -> None:
        """A ``torch.save`` of simulated tensors wrote nothing."""
