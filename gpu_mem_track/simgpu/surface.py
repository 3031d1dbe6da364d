"""How a simulated GPU treats every public name of ``torch.cuda`` and its neighbours.

:data:`SURFACE` names each public name of ``torch.cuda``, ``torch.cuda.memory``,
``torch.cuda.nvtx``, ``torch.cuda.amp``, ``torch.amp``, ``torch.backends.cuda`` and
``torch.backends.cudnn`` with one of three treatments:

- ``simulated``: replaced for the session by a version that answers from the simulated
  GPU (most in :mod:`~gpu_mem_track.simgpu.cudaapi`, the rest here);
- ``passthrough``: torch's own, which works unchanged inside a simulation (exception
  classes, constants, submodules, global switches such as ``cudnn.benchmark``, and
  wrappers that only call simulated names);
- ``refused``: replaced by a stand-in raising :class:`NotSimulated`, one error naming
  the function and saying the simulation does not support it (CUDA graphs, memory
  pools, pluggable allocators, NVML's clocks and temperatures, pinned host memory
  statistics, the cuBLAS handles).

Below the Python API, :func:`install` also replaces every ``torch._C._cuda_*`` function
(the CUDA build's bindings, which would read, initialise or fail on the real GPU): a few
answer from the simulation (:data:`C_SIMULATED`), the rest raise :class:`NotSimulated`.
So a simulated run on the CUDA build never reaches the real GPU, visible or not, from
Python. A name the table does not know (a new torch's) is left alone, and
``tests/test_simgpu_surface.py`` fails naming it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from .cudanames import nested_stats, set_both
from .patches import Patches

if TYPE_CHECKING:
    from .running import RunningGpu

__all__ = ["C_SIMULATED", "SURFACE", "NotSimulated", "install", "public_names"]

MODULES = (
    "torch.cuda",
    "torch.cuda.memory",
    "torch.cuda.nvtx",
    "torch.cuda.amp",
    "torch.amp",
    "torch.backends.cuda",
    "torch.backends.cudnn",
)

_LEGACY = (
    " ".join(
        f"{kind}{suffix}"
        for kind in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
        for suffix in ("Tensor", "Storage")
    )
    + " ComplexDoubleStorage ComplexFloatStorage"
)
_MEMORY_SIMULATED = (
    "caching_allocator_alloc caching_allocator_delete caching_allocator_enable empty_cache "
    "get_allocator_backend get_per_process_memory_fraction list_gpu_processes max_memory_allocated "
    "max_memory_reserved mem_get_info memory_allocated memory_reserved memory_snapshot memory_stats "
    "memory_stats_as_nested_dict memory_summary reset_accumulated_memory_stats reset_max_memory_allocated "
    "reset_max_memory_cached reset_peak_memory_stats set_per_process_memory_fraction"
)
_MEMORY_REFUSED = (
    "CUDAPluggableAllocator MemPool caching_allocator_disabled change_current_allocator host_memory_stats "
    "host_memory_stats_as_nested_dict reset_accumulated_host_memory_stats reset_peak_host_memory_stats "
    "use_mem_pool"
)
_TABLE: dict[str, dict[str, str]] = {
    "torch.cuda": {
        "simulated": _MEMORY_SIMULATED
        + " Event Stream can_device_access_peer current_device current_stream default_stream device "
        "device_count device_memory_used device_of get_arch_list get_device_capability get_device_name "
        "get_device_properties get_gencode_flags get_rng_state get_rng_state_all get_sync_debug_mode init "
        "initial_seed ipc_collect is_available is_bf16_supported is_current_stream_capturing is_initialized "
        "is_tf32_supported manual_seed manual_seed_all seed seed_all set_device set_rng_state "
        "set_rng_state_all set_stream set_sync_debug_mode stream synchronize " + _LEGACY,
        "passthrough": "AcceleratorError CudaError DeferredCudaCallError OutOfMemoryError StreamContext "
        "classproperty cudaStatus default_generators has_half has_magma max_memory_cached memory_cached "
        "amp gds graphs green_contexts jiterator memory nccl nvtx profiler random sparse streams tunable",
        "refused": _MEMORY_REFUSED
        + " CUDAGraph ExternalStream GreenContext check_error clock_rate cudart current_blas_handle "
        "current_solver_handle get_stream_from_external graph graph_pool_handle make_graphed_callables "
        "memory_usage power_draw temperature utilization",
    },
    "torch.cuda.memory": {
        "simulated": _MEMORY_SIMULATED + " is_initialized",
        "passthrough": "max_memory_cached memory_cached",
        "refused": _MEMORY_REFUSED,
    },
    "torch.cuda.nvtx": {"simulated": "mark range range_end range_pop range_push range_start"},
    "torch.cuda.amp": {
        "passthrough": "GradScaler amp_definitely_not_available autocast autocast_mode common custom_bwd "
        "custom_fwd grad_scaler",
    },
    "torch.amp": {
        "passthrough": "GradScaler autocast autocast_mode custom_bwd custom_fwd grad_scaler "
        "is_autocast_available",
    },
    "torch.backends.cuda": {
        "simulated": "cublas_workspace_size is_built is_flash_attention_available",
        "passthrough": "SDPAParams SDPBackend allow_fp16_bf16_reduction_math_sdp blas_workspace_size "
        "cuBLASModule cuFFTPlanCache cuFFTPlanCacheAttrContextProp cuFFTPlanCacheManager cudnn_sdp_enabled "
        "enable_cudnn_sdp "
        "enable_flash_sdp enable_math_sdp enable_mem_efficient_sdp flash_sdp_enabled "
        "fp16_bf16_reduction_math_sdp_allowed is_ck_sdpa_available math_sdp_enabled matmul "
        "mem_efficient_sdp_enabled preferred_blas_library preferred_linalg_library preferred_rocm_fa_library "
        "sdp_kernel",
        "refused": "can_use_cudnn_attention can_use_efficient_attention can_use_flash_attention "
        "cublaslt_workspace_size cufft_plan_cache",
    },
    "torch.backends.cudnn": {
        "simulated": "benchmark_limit is_acceptable is_available version",
        "passthrough": "ContextProp CudnnModule PropModule allow_tf32 benchmark conv deterministic "
        "depthwise_kernel enabled flags fp32_precision rnn set_flags",
    },
}

#: ``"module.name"`` -> ``"simulated"``, ``"passthrough"`` or ``"refused"`` (module doc).
SURFACE: dict[str, str] = {
    f"{module}.{name}": kind
    for module, kinds in _TABLE.items()
    for kind, names in kinds.items()
    for name in names.split()
}

#: Why a refused name is refused, by the last part of its name (default: ``_REASON``).
_WHY = {
    **dict.fromkeys(("CUDAGraph", "graph", "graph_pool_handle", "make_graphed_callables"), "CUDA graphs"),
    **dict.fromkeys(
        ("MemPool", "use_mem_pool", "CUDAPluggableAllocator", "change_current_allocator"),
        "memory pools and other allocators",
    ),
    "caching_allocator_disabled": "allocating without the caching allocator",
    **dict.fromkeys(
        ("clock_rate", "power_draw", "temperature", "utilization", "memory_usage"), "NVML's device sensors"
    ),
    **dict.fromkeys(
        (
            "host_memory_stats",
            "host_memory_stats_as_nested_dict",
            "reset_accumulated_host_memory_stats",
            "reset_peak_host_memory_stats",
        ),
        "pinned host memory",
    ),
    **dict.fromkeys(("ExternalStream", "get_stream_from_external"), "streams made outside torch"),
    **dict.fromkeys(
        ("can_use_cudnn_attention", "can_use_efficient_attention", "can_use_flash_attention"),
        "the attention kernels' own checks (it picks the backend itself)",
    ),
    "cublaslt_workspace_size": "a cuBLASLt workspace apart from the cuBLAS one",
    "cufft_plan_cache": "cuFFT plan caches",
}
_REASON = "the real CUDA runtime (handles, errors, green contexts)"


class NotSimulated(NotImplementedError):
    """A CUDA function the simulated GPU does not model was called inside a simulation
    (``run --simulate``, ``simulated_gpu``): the message names it and what is missing."""


def refusal(qualname: str, why: str | None = None) -> str:
    """The message of :class:`NotSimulated` for ``qualname``."""
    what = why or _WHY.get(qualname.rpartition(".")[2], _REASON)
    return (
        f"{qualname} is not supported on the simulated GPU (gpu_mem_track does not simulate {what}); "
        "run this part on a real GPU, or leave it out of the simulated run"
    )


@functools.cache
def _refuser(qualname: str, original: Any, why: str | None = None) -> Any:
    """A stand-in for ``original`` raising :class:`NotSimulated` when called (a class
    for a class, so ``isinstance`` checks still work and answer False); made once."""
    message = refusal(qualname, why)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulated(message)

    if isinstance(original, type):
        return type(original.__name__, (), {"__new__": refuse, "__doc__": message})
    if not callable(original):
        return _RefusedObject(message)
    refuse.__name__ = refuse.__qualname__ = qualname.rpartition(".")[2]
    refuse.__doc__ = message
    return refuse


class _RefusedObject:
    """An object (``cufft_plan_cache``) whose every use raises :class:`NotSimulated`."""

    def __init__(self, message: str) -> None:
        object.__setattr__(self, "_message", message)

    def __getattr__(self, name: str) -> Any:
        raise NotSimulated(object.__getattribute__(self, "_message"))

    def __getitem__(self, key: Any) -> Any:
        raise NotSimulated(self._message)

    def __setattr__(self, name: str, value: Any) -> None:
        raise NotSimulated(self._message)


def public_names(module: Any) -> list[str]:
    """The public names of ``module`` the table must cover: its ``__all__``, and every
    name without a leading underscore that torch defines (its classes, functions and
    submodules; not what it imports from ``typing`` or ``os``). For a module that torch
    wraps in a ``PropModule`` (``torch.backends.cudnn``), the wrapped module's names
    and the wrapper's properties."""
    names = set(getattr(module, "__all__", ()))
    wrapped = module.m if isinstance(module, torch.backends.PropModule) else module
    for name, value in vars(wrapped).items():
        if name.startswith("_"):
            continue
        if isinstance(value, type(os)):
            if value.__name__.startswith(f"{wrapped.__name__}."):
                names.add(name)
            continue
        owner = getattr(value, "__module__", None)
        if isinstance(owner, str) and owner.split(".")[0] == "torch":
            names.add(name)
    if wrapped is not module:
        names |= {name for name in vars(type(module)) if not name.startswith("_")}
    return sorted(names)


class _Settings:
    """The simulated GPU's switches that torch keeps in the CUDA library."""

    def __init__(self) -> None:
        self.sync_debug_mode = 0
        self.benchmark_limit = 10


def install(gpu: RunningGpu, patches: Patches) -> None:
    """Put in place the simulated names of :data:`SURFACE` that ``cudaapi`` leaves, the
    refused ones, and the ``torch._C._cuda_*`` guard (see the module doc)."""
    settings = _Settings()
    _simulated(gpu, patches, settings)
    _refused(patches)
    _guard(gpu, patches, settings)


def _refused(patches: Patches) -> None:
    import importlib

    for module_name, kinds in _TABLE.items():
        module = importlib.import_module(module_name)
        wrapped = module.m if isinstance(module, torch.backends.PropModule) else module
        for name in kinds.get("refused", "").split():
            if name in vars(wrapped):  # names an older torch lacks stay absent
                patches.set(module, name, _refuser(f"{module_name}.{name}", getattr(module, name)))


def _simulated(gpu: RunningGpu, patches: Patches, settings: _Settings) -> None:
    """The ``simulated`` names ``cudaapi`` does not replace."""
    from .legacy import legacy_types

    spec, memory = gpu.spec, gpu.memory
    blocks: dict[int, int] = {}

    def alloc(size: int, device: Any = None, stream: Any = None) -> int:
        address, _ = memory.take(int(size))
        blocks[address] = int(size)
        return address

    def delete(mem_ptr: int) -> None:
        if blocks.pop(mem_ptr, None) is None:
            raise RuntimeError(f"caching_allocator_delete: {mem_ptr} is no caching_allocator_alloc block")
        memory.give_back(mem_ptr)

    def used(device: Any = None) -> int:
        return memory.reserved + spec.non_pytorch_bytes  # as mem_get_info and the OOM message count

    def processes(device: Any = None) -> str:
        return f"GPU:0\nprocess {os.getpid():>10d} uses {used() / (1024 * 1024):12.3f} MB GPU memory"

    def fraction(device: Any = None) -> float:
        return 1.0 if memory.allowed is None else memory.allowed / spec.total_memory

    for name, value in {
        "caching_allocator_alloc": alloc,
        "caching_allocator_delete": delete,
        "get_allocator_backend": lambda: "native",
        "get_per_process_memory_fraction": fraction,
        "list_gpu_processes": processes,
        "is_initialized": lambda: True,
    }.items():
        set_both(patches, name, value)
    arch = "{}{}".format(*spec.capability)
    for name, value in {
        "device_memory_used": used,
        "get_gencode_flags": lambda: f"-gencode compute=compute_{arch},code=sm_{arch}",
        "get_sync_debug_mode": lambda: settings.sync_debug_mode,
        "set_sync_debug_mode": lambda debug_mode: _set_sync_debug(settings, debug_mode),
        **legacy_types(),
    }.items():
        patches.set(torch.cuda, name, value)
    patches.set(torch.cuda.nvtx, "range", _nvtx_range)
    _backends(gpu, patches, settings)


def _backends(gpu: RunningGpu, patches: Patches, settings: _Settings) -> None:
    """The simulated names of ``torch.backends.cuda`` and ``torch.backends.cudnn``."""
    spec, workspace = gpu.spec, gpu.storages.workspace

    def cublas_workspace_size(size: int | None = None) -> int:
        if size is not None:
            if size < 0:
                raise RuntimeError(f"cuBLAS workspace size must be non-negative, got {size}")
            workspace.nbytes = int(size)
        return workspace.nbytes

    patches.set(torch.backends.cuda, "cublas_workspace_size", cublas_workspace_size)
    patches.set(torch.backends.cuda, "is_flash_attention_available", lambda: spec.capability >= (8, 0))
    patches.set(
        type(torch.backends.cudnn),
        "benchmark_limit",
        torch.backends.ContextProp(
            lambda: settings.benchmark_limit, lambda n: setattr(settings, "benchmark_limit", int(n))
        ),
    )


def _set_sync_debug(settings: _Settings, mode: int | str) -> None:
    """``set_sync_debug_mode``: 0/"default", 1/"warn", 2/"error" (kept; nothing syncs)."""
    names = {"default": 0, "warn": 1, "error": 2}
    if isinstance(mode, str):
        if mode not in names:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        mode = names[mode]
    settings.sync_debug_mode = int(mode)


@contextlib.contextmanager
def _nvtx_range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
    """``torch.cuda.nvtx.range``: a context manager and, as torch's, a decorator; no-op."""
    yield


def _guard(gpu: RunningGpu, patches: Patches, settings: _Settings) -> None:
    """Every ``torch._C._cuda_*`` function: simulated (:data:`C_SIMULATED`) or refused."""
    simulated = _c_simulated(gpu, settings)
    for name in [n for n in dir(torch._C) if n.startswith("_cuda_")]:
        original = getattr(torch._C, name)
        if isinstance(original, type) or not callable(original):
            continue
        value = simulated.get(name)
        if value is None:
            value = _refuser(f"torch._C.{name}", original, "this part of the CUDA runtime")
        patches.set(torch._C, name, value)


#: The ``torch._C._cuda_*`` functions that answer from the simulated GPU (torch's Python
#: side calls them where it does not go through a replaced ``torch.cuda`` name).
C_SIMULATED = (
    "_cuda_getDeviceCount",
    "_cuda_getDevice",
    "_cuda_setDevice",
    "_cuda_exchangeDevice",
    "_cuda_maybeExchangeDevice",
    "_cuda_isInBadFork",
    "_cuda_hasPrimaryContext",
    "_cuda_init",
    "_cuda_synchronize",
    "_cuda_isCurrentStreamCapturing",
    "_cuda_memoryStats",
    "_cuda_emptyCache",
    "_cuda_getCompiledVersion",
    "_cuda_get_sync_debug_mode",
    "_cuda_set_sync_debug_mode",
    "_cuda_get_cudnn_benchmark_limit",
    "_cuda_set_cudnn_benchmark_limit",
    "_cuda_getCublasWorkspaceSize",
    "_cuda_isHistoryEnabled",
)


def _c_simulated(gpu: RunningGpu, settings: _Settings) -> dict[str, Callable[..., Any]]:

    compiled = _compiled_version()
    table: dict[str, Callable[..., Any]] = {
        "_cuda_getDeviceCount": lambda: 1,
        "_cuda_getDevice": lambda: 0,
        "_cuda_setDevice": lambda device: None,
        "_cuda_exchangeDevice": lambda device: 0,
        "_cuda_maybeExchangeDevice": lambda device: 0,
        "_cuda_isInBadFork": lambda: False,
        "_cuda_hasPrimaryContext": lambda device: True,
        "_cuda_init": lambda: None,
        "_cuda_synchronize": lambda: None,
        "_cuda_isCurrentStreamCapturing": lambda: False,
        "_cuda_memoryStats": lambda device=0: nested_stats(gpu.allocator.stats.as_dict()),
        "_cuda_emptyCache": gpu.memory.empty_cache,
        "_cuda_getCompiledVersion": lambda: compiled,
        "_cuda_get_sync_debug_mode": lambda: settings.sync_debug_mode,
        "_cuda_set_sync_debug_mode": lambda mode: _set_sync_debug(settings, mode),
        "_cuda_get_cudnn_benchmark_limit": lambda: settings.benchmark_limit,
        "_cuda_set_cudnn_benchmark_limit": lambda n: setattr(settings, "benchmark_limit", int(n)),
        "_cuda_getCublasWorkspaceSize": lambda: gpu.storages.workspace.nbytes,
        "_cuda_isHistoryEnabled": lambda: gpu.memory.history is not None,
    }
    assert set(table) == set(C_SIMULATED)
    return table


def _compiled_version() -> int:
    """The CUDA version torch says it was built with, as ``_cuda_getCompiledVersion``
    gives it (12040 for 12.4); a CPU build's simulated GPU says 12.8."""
    text = torch.version.cuda or "12.8"
    major, _, minor = text.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10
