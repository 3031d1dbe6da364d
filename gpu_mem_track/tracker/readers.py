"""Memory readers: the allocator, the driver and the process, behind one interface.

A reader answers three questions for a device and never changes what it measures: no
``empty_cache()``, no reset of peak statistics, and no CUDA initialisation (when the
program has not started CUDA, CUDA figures are simply unknown). ``FakeReader`` stands
in for all of them in tests.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any, Protocol

from ..devices import parse_device

__all__ = [
    "AllocatorReading",
    "CudaReader",
    "DriverReading",
    "FakeReader",
    "MemoryReader",
    "ProcessReader",
    "process_rss",
    "reader_for",
]


@dataclass(frozen=True)
class AllocatorReading:
    """The CUDA caching allocator's counters for one device, in bytes (current values,
    and the peak of ``allocated`` since the program started or last reset it)."""

    allocated: int
    requested: int
    reserved: int
    peak_allocated: int


@dataclass(frozen=True)
class DriverReading:
    """Device memory the driver attributes to this process (or, per ``source``, the GPU).

    ``source`` is ``"nvml process"`` or ``"nvml device-wide"``.
    """

    nbytes: int
    source: str


class MemoryReader(Protocol):
    """What a tracker asks about memory. Each method returns None when it cannot know."""

    def allocator(self, device: str) -> AllocatorReading | None: ...

    def driver(self, device: str) -> DriverReading | None: ...

    def rss(self) -> int | None: ...


def process_rss() -> int | None:
    """Resident set size of this process in bytes, or None where it cannot be read."""
    try:  # io.open: at interpreter shutdown the builtin open is gone (a track() in __del__)
        with io.open("/proc/self/statm", encoding="ascii") as statm:  # noqa: UP020
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


class ProcessReader:
    """CPU runs: no allocator, no driver; the process RSS."""

    def allocator(self, device: str) -> AllocatorReading | None:
        return None

    def driver(self, device: str) -> DriverReading | None:
        return None

    def rss(self) -> int | None:
        return process_rss()


class CudaReader(ProcessReader):
    """The CUDA caching allocator through ``torch.cuda.memory_stats`` and the driver
    through NVML (package nvidia-ml-py), both read only once the program initialised
    CUDA itself. Inside a simulated GPU (:mod:`~gpu_mem_track.simgpu`) the allocator is
    the simulation's (its ``torch.cuda.memory_stats``) and the driver figure is unknown:
    NVML would read the real GPU, not the simulated one."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._nvml_failed = False
        self._handles: dict[int, Any] = {}

    def allocator(self, device: str) -> AllocatorReading | None:
        import torch

        if not torch.cuda.is_initialized():
            return None
        stats = torch.cuda.memory_stats(device)
        return AllocatorReading(
            allocated=int(stats.get("allocated_bytes.all.current", 0)),
            requested=int(stats.get("requested_bytes.all.current", 0)),
            reserved=int(stats.get("reserved_bytes.all.current", 0)),
            peak_allocated=int(stats.get("allocated_bytes.all.peak", 0)),
        )

    def driver(self, device: str) -> DriverReading | None:
        import torch

        from ..simgpu.running import running_gpu

        if running_gpu() is not None or not torch.cuda.is_initialized():
            return None
        handle = self._handle(parse_device(device).ordinal)
        if handle is None:
            return None
        return nvml_usage(self._nvml, handle, os.getpid())

    def _handle(self, index: int) -> Any:
        if index in self._handles:
            return self._handles[index]
        nvml = self._load_nvml()
        handle = None
        if nvml is not None:
            handle = nvml_handle(nvml, index)
        self._handles[index] = handle
        return handle

    def _load_nvml(self) -> Any:
        if self._nvml is None and not self._nvml_failed:
            try:
                import pynvml  # type: ignore[import-not-found]

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:
                self._nvml_failed = True
        return self._nvml


def nvml_handle(nvml: Any, cuda_index: int) -> Any:
    """The NVML handle of CUDA device ``cuda_index``, matched by UUID so that
    ``CUDA_VISIBLE_DEVICES`` reordering is respected; None when not found."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(nvml_uuid(uuid))
    except Exception:
        try:
            return nvml.nvmlDeviceGetHandleByIndex(cuda_index)
        except Exception:
            return None


def nvml_uuid(uuid: str) -> str:
    """A GPU UUID as NVML and ``CUDA_VISIBLE_DEVICES`` spell it (``GPU-...`` or ``MIG-...``);
    torch reports it without the prefix."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def nvml_usage(nvml: Any, handle: Any, pid: int) -> DriverReading | None:
    """This process's device memory per NVML, else the device-wide used memory.

    Inside containers the driver may list the process under another pid; the
    device-wide figure then stands in, labelled so.
    """
    try:
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return DriverReading(int(proc.usedGpuMemory), "nvml process")
    except Exception:
        pass
    try:
        return DriverReading(int(nvml.nvmlDeviceGetMemoryInfo(handle).used), "nvml device-wide")
    except Exception:
        return None


@dataclass
class FakeReader:
    """A reader returning fixed figures (tests, and replaying recorded numbers)."""

    allocator_reading: AllocatorReading | None = None
    driver_reading: DriverReading | None = None
    rss_bytes: int | None = None

    def allocator(self, device: str) -> AllocatorReading | None:
        return self.allocator_reading

    def driver(self, device: str) -> DriverReading | None:
        return self.driver_reading

    def rss(self) -> int | None:
        return self.rss_bytes


def reader_for(device: str) -> MemoryReader:
    """The real reader for a device string: ``CudaReader`` for CUDA, else ``ProcessReader``."""
    return CudaReader() if device.startswith("cuda") else ProcessReader()
