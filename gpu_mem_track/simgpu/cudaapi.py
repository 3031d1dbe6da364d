"""``torch.cuda`` (and ``torch.accelerator``, ``torch.backends``) answering from a
simulated GPU, on the CPU wheel and on a CUDA wheel without a GPU.

:func:`install` replaces, for the time of a session, the functions a training script
calls: availability and device queries (one device, index 0, the spec's name,
properties and capability), memory statistics from the allocator model (torch's own
``memory_allocated``/``max_*``/``memory_summary`` read the replaced ``memory_stats``),
``mem_get_info`` (free = capacity - reserved), ``empty_cache`` and
``reset_peak_memory_stats`` on the model, streams and events with the same API and no
effect (one stream: allocations are not split by stream), seeding (no-ops: simulated
tensors have no values), NVTX ranges (no-ops), memory history and snapshots from the
model (:mod:`~gpu_mem_track.simgpu.snapshot`), ``Tensor.pin_memory`` (a no-op, also in
the DataLoader's pin-memory thread, which the torch-function mode does not reach), and
``torch.load`` with a CUDA ``map_location`` (loaded on the CPU, then simulated) and
``torch.save`` of simulated tensors (nothing written; counted). The rest of the
``torch.cuda`` surface, and the guard that keeps every ``torch._C._cuda_*`` call away
from the real GPU, are :mod:`~gpu_mem_track.simgpu.surface`'s.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from ..gpumodel.reduce import threads_per_multiprocessor
from . import running, surface
from .cudanames import nested_stats, set_both
from .patches import Patches
from .snapshot import make_snapshot

if TYPE_CHECKING:
    from .running import RunningGpu

__all__ = ["DeviceProperties", "install"]


class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns, for the simulated GPU."""

    def __init__(self, gpu: RunningGpu) -> None:
        spec = gpu.spec
        self.name = spec.device_name or spec.name
        self.major, self.minor = spec.capability
        self.total_memory = spec.total_memory
        self.multi_processor_count = spec.multiprocessors
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.warp_size = 32
        self.max_threads_per_multi_processor = threads_per_multiprocessor(spec.capability)
        self.L2_cache_size = 40 << 20
        self.uuid = "00000000-0000-0000-0000-000000000000"
        self.gcnArchName = "NVIDIA"

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1 << 20)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


class _Event:
    """``torch.cuda.Event``: always complete; ``elapsed_time`` is the wall time on this
    machine between two records (ms, at least 0.001, so throughput arithmetic in
    benchmarking scripts does not divide by zero)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.at = time.perf_counter()

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: Any) -> float:
        return max((end_event.at - self.at) * 1000.0, 0.001)


class _Stream:
    """``torch.cuda.Stream``: same API, no effect (every allocation is on stream 0)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cuda", 0)
        self.priority = priority
        self.stream_id = 0
        self.cuda_stream = 0

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _Event:
        return event if event is not None else _Event()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return 0


class _DeviceContext:
    """``torch.cuda.device(i)`` / ``device_of(t)``: device 0 is the only one."""

    def __init__(self, device: Any = None) -> None:
        self.idx = 0

    def __enter__(self) -> _DeviceContext:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def install(gpu: RunningGpu, patches: Patches) -> None:
    """Replace the ``torch.cuda``-side functions for ``gpu`` (see the module doc)."""
    import torch._dynamo  # noqa: F401  (its rule table indexes torch.cuda's functions once: the originals)

    _devices(gpu, patches)
    _memory(gpu, patches)
    _streams(patches)
    _seeding_and_nvtx(patches)
    _files(gpu, patches)
    surface.install(gpu, patches)  # the rest of torch.cuda's names, and torch._C._cuda_*
    patches.set(running, "current", gpu)  # what the memory readers ask (never the real GPU)


def _devices(gpu: RunningGpu, patches: Patches) -> None:
    spec, props = gpu.spec, DeviceProperties(gpu)
    for name, value in {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": _none,
        "_lazy_init": _none,
        "device_count": lambda: 1,
        "current_device": _zero,
        "set_device": _none,
        "device": _DeviceContext,
        "device_of": _DeviceContext,
        "get_device_name": lambda device=None: props.name,
        "get_device_capability": lambda device=None: spec.capability,
        "get_device_properties": lambda device=None: props,
        "is_bf16_supported": lambda including_emulation=True: (
            spec.capability >= (8, 0) or including_emulation
        ),
        "is_tf32_supported": lambda: spec.capability >= (8, 0),
        "get_arch_list": lambda: ["sm_{}{}".format(*spec.capability)],
        "synchronize": _none,
        "ipc_collect": _none,
        "can_device_access_peer": lambda device, peer: False,
    }.items():
        patches.set(torch.cuda, name, value)
    _accelerator(patches)
    patches.set(torch.backends.cudnn, "is_available", lambda: True)
    patches.set(torch.backends.cudnn, "version", lambda: 90100)
    patches.set(torch.backends.cudnn, "is_acceptable", lambda tensor: False)  # RNNs: the native path
    patches.set(torch.backends.cuda, "is_built", lambda: True)


def _accelerator(patches: Patches) -> None:
    """``torch.accelerator`` (the DataLoader's pin-memory thread and the optimizers ask it)."""
    accelerator = torch.accelerator
    for name, value in {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": _zero,
        "current_device_idx": _zero,
        "set_device_index": _none,
        "set_device_idx": _none,
        "synchronize": _none,
    }.items():
        if hasattr(accelerator, name):
            patches.set(accelerator, name, value)


def _memory(gpu: RunningGpu, patches: Patches) -> None:
    allocator = gpu.allocator
    summary = torch.cuda.memory.memory_summary
    allocated, reserved = allocator.stats.get("allocated_bytes"), allocator.stats.get("reserved_bytes")

    def capacity_left(device: Any = None) -> tuple[int, int]:
        return max(gpu.spec.capacity - allocator.reserved, 0), gpu.spec.total_memory

    def reset_peaks(device: Any = None) -> None:
        for family in allocator.stats.families.values():
            for stat in family.values():
                stat.peak = stat.current
        for stat in (allocator.stats.oversize_allocations, allocator.stats.oversize_segments):
            stat.peak = stat.current

    def reset_accumulated(device: Any = None) -> None:
        for family in allocator.stats.families.values():
            for stat in family.values():
                stat.allocated = stat.freed = 0

    for name, value in {
        "memory_stats": lambda device=None: allocator.stats.as_dict(),
        # the four a sampler reads at every line: straight from the statistics, no dict
        "memory_allocated": lambda device=None: allocated.current,
        "max_memory_allocated": lambda device=None: allocated.peak,
        "memory_reserved": lambda device=None: reserved.current,
        "max_memory_reserved": lambda device=None: reserved.peak,
        "memory_stats_as_nested_dict": lambda device=None: nested_stats(allocator.stats.as_dict()),
        "memory_summary": lambda device=None, abbreviated=False: summary(0, abbreviated),
        "mem_get_info": capacity_left,
        "empty_cache": gpu.memory.empty_cache,
        "reset_peak_memory_stats": reset_peaks,
        "reset_max_memory_allocated": reset_peaks,
        "reset_max_memory_cached": reset_peaks,
        "reset_accumulated_memory_stats": reset_accumulated,
        "set_per_process_memory_fraction": lambda fraction, device=None: gpu.memory.set_fraction(fraction),
        "caching_allocator_enable": _none,
        "_record_memory_history": lambda enabled="all", *args, **kwargs: _record(gpu, enabled, kwargs),
        "_snapshot": lambda device=None, *args, **kwargs: make_snapshot(gpu),
        "memory_snapshot": lambda *args, **kwargs: make_snapshot(gpu)["segments"],
    }.items():
        set_both(patches, name, value)


def _record(gpu: RunningGpu, enabled: Any, kwargs: dict[str, Any]) -> None:
    """``_record_memory_history(enabled=...)``: ``None``/``False`` stops, anything else records."""
    on = enabled not in (None, False)
    gpu.memory.record(on, int(kwargs.get("max_entries", sys.maxsize)))


def _streams(patches: Patches) -> None:
    default = _Stream()
    patches.set(torch.accelerator, "current_stream", lambda device=None: default)
    patches.set(torch.accelerator, "set_stream", _none)
    for name, value in {
        "is_current_stream_capturing": lambda: False,
        "Stream": _Stream,
        "Event": _Event,
        "current_stream": lambda device=None: default,
        "default_stream": lambda device=None: default,
        "stream": lambda stream=None: contextlib.nullcontext(stream),
        "set_stream": _none,
    }.items():
        patches.set(torch.cuda, name, value)


def _seeding_and_nvtx(patches: Patches) -> None:
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_rng_state_all"):
        patches.set(torch.cuda, name, _none)
    patches.set(torch.cuda, "initial_seed", _zero)
    patches.set(torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state())
    patches.set(torch.cuda, "get_rng_state_all", lambda: [torch.get_rng_state()])
    nvtx = torch.cuda.nvtx
    for name, value in {
        "range_push": _zero,
        "range_pop": _zero,
        "range_start": _zero,
        "range_end": _none,
        "mark": _none,
        "range": lambda *args, **kwargs: contextlib.nullcontext(),
    }.items():
        patches.set(nvtx, name, value)


def _files(gpu: RunningGpu, patches: Patches) -> None:
    save, load = torch.save, torch.load

    def simulated_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        with torch._C.DisableTorchFunction():
            simulated = _holds_simulated(obj)
        if simulated:
            gpu.note_skipped_save()
            return None
        return save(obj, f, *args, **kwargs)

    def simulated_load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not _to_cuda(map_location):
            return load(f, map_location, *args, **kwargs)
        loaded = load(f, "cpu", *args, **kwargs)
        return _simulate(loaded)

    def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        return self

    patches.set(torch, "Generator", _generator_class())
    patches.set(torch, "save", simulated_save)
    patches.set(torch, "load", simulated_load)
    patches.set(torch.Tensor, "pin_memory", pin_memory)


def _generator_class() -> type:
    """``torch.Generator`` whose CUDA generators are CPU ones (simulated tensors draw
    their known values on the CPU); ``isinstance(g, torch.Generator)`` still holds."""
    base = torch.Generator

    class Generator(base):  # type: ignore[misc, valid-type]
        def __new__(cls, device: Any = "cpu") -> Any:
            from .face import is_cuda_device

            return super().__new__(cls, "cpu" if is_cuda_device(device) else device)

        def __init__(self, device: Any = "cpu") -> None:
            pass

    Generator.__qualname__ = Generator.__name__ = "Generator"
    return Generator


def _to_cuda(location: Any) -> bool:
    if isinstance(location, (str, torch.device, int)) and not isinstance(location, bool):
        from .face import is_cuda_device

        return is_cuda_device(location)
    if isinstance(location, dict):
        return any(str(v).startswith("cuda") for v in location.values())
    return False


def _holds_simulated(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` holds a simulated (meta) tensor, looking 12 containers deep."""
    if isinstance(obj, torch.Tensor):
        return obj.is_meta
    if depth > 12:
        return False
    if isinstance(obj, dict):
        return any(_holds_simulated(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(_holds_simulated(v, depth + 1) for v in obj)
    return False


def _simulate(obj: Any, depth: int = 0) -> Any:
    """``obj`` with its CPU tensors moved to the simulated GPU (12 containers deep)."""
    if isinstance(obj, torch.Tensor):
        return obj.to("meta")
    if depth > 12:
        return obj
    if isinstance(obj, dict):
        return type(obj)((k, _simulate(v, depth + 1)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        items = [_simulate(v, depth + 1) for v in obj]
        return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
    return obj
