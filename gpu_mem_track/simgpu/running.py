"""The running simulated GPU: what the parts that stand in for CUDA need of it, and which
one is running in this process, asked without importing torch.

:class:`~gpu_mem_track.simgpu.session.SimulatedGpu` builds the GPU and hands itself to
the ``torch.cuda`` API (:mod:`~gpu_mem_track.simgpu.cudaapi`), the snapshot
(:mod:`~gpu_mem_track.simgpu.snapshot`) and the fake process group
(:mod:`~gpu_mem_track.simgpu.ranks`); they see it through :class:`RunningGpu`, so none of
them imports the session that installs them.

While a simulated GPU is entered, :func:`running_gpu` returns it and :func:`live_counters`
the allocator model's statistics the line sampler reads at every line
(:class:`LiveCounters`). The memory readers (``runner.samplers``, ``tracker.readers``) ask
here first, so that inside a simulation they read the model and never the real GPU: on a
CUDA build of torch, ``torch._C._cuda_memoryStats`` and NVML read the real device, or fail
where none is visible. Outside a simulation both return None. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..allocator import Allocator
    from .catalog import GpuSpec
    from .engine import GpuMemory, Storages

__all__ = ["LiveCounters", "RunningGpu", "live_counters", "running_gpu"]


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


#: The simulated GPU now entered (set and put back by ``cudaapi.install``'s patches).
current: Any = None


@dataclass(frozen=True)
class LiveCounters:
    """Three of the allocator model's statistics, as live objects (each has ``current``,
    ``peak``, ``allocated`` and ``freed``, and changes in place as the model runs):
    ``allocated_bytes`` and ``reserved_bytes`` (bytes, torch's ``allocated_bytes.all``
    and ``reserved_bytes.all``) and ``allocations`` (torch's ``allocation.all``: its
    ``allocated`` + ``freed`` counts the allocations and frees so far, one trace entry
    each). Reading an attribute costs what a Python attribute read costs: no dict."""

    allocated_bytes: Any
    reserved_bytes: Any
    allocations: Any


def running_gpu() -> RunningGpu | None:
    """The simulated GPU entered in this process, or None."""
    return current


def live_counters() -> LiveCounters | None:
    """The running simulated GPU's :class:`LiveCounters`, or None outside a simulation."""
    gpu = current
    if gpu is None:
        return None
    stats = gpu.allocator.stats
    return LiveCounters(stats.get("allocated_bytes"), stats.get("reserved_bytes"), stats.get("allocation"))
