"""The device a simulated step runs on: the simulated GPU for the CUDA target, exact
sizes for the CPU target.

On the CUDA target the step (the built-in one or the user's ``step``) runs inside
:class:`~gpu_mem_track.simgpu.SimulatedGpu`, the same device ``run --simulate`` and
``simulated_gpu`` use: the model's parameters and the inputs are simulated GPU tensors,
every storage is a block of the caching-allocator model, ``torch.autocast("cuda")``
applies CUDA's op lists (the built-in step's ``amp`` is that autocast),
``scaled_dot_product_attention`` takes the backend the GPU would pick, the cuBLAS
workspaces are allocated per handle, and ``torch.cuda`` answers from the simulation.
The estimator's tracker is the device's own storage tracker, and its known values the
device's. Which GPU (:func:`target_spec`): ``gpu=None`` or an architecture name
(``"hopper"``, see ``GPU_ARCHITECTURES``) is a GPU of that compute capability
(``None``: 8.0) with unbounded memory (:data:`UNBOUNDED`, no context), so the estimate
is the step's whole peak, and the SM count of that architecture's data-centre GPU
(``catalog.ARCHITECTURE_GPUS``: ampere the A100's), which sizes CUDA's reduction staging
(:mod:`~gpu_mem_track.gpumodel.reduce`) as ``run --simulate`` on that GPU does; a
catalog name (``"a100-40gb"``) or ``SIZE:smXY`` is that GPU, whose capacity the step
may run out of (``torch.OutOfMemoryError``, as on the GPU): its
total memory less its non-PyTorch memory (the CUDA context and the cuBLAS/cuDNN
handles; a saved probe result for that GPU takes precedence over the catalog's figure,
see ``simgpu.catalog``).

On the CPU target storages count their exact bytes (no allocator, no autocast) on the
plain meta device (or real CPU tensors when validating).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..dispatch.lifetimes import Lifetimes
from ..dispatch.memory import ExactMemory
from ..dispatch.values import KnownValues
from ..errors import UsageError
from ..gpumodel.workspace import GPU_ARCHITECTURES, CublasWorkspace, workspace_bytes
from ..simgpu.catalog import GPUS, GpuSpec, multiprocessors_of, parse_gpu, workspace_default
from ..units import format_bytes
from .options import StepOptions

__all__ = ["UNBOUNDED", "DoesNotFit", "Target", "capacity_text", "open_target", "target_spec"]

#: Memory (bytes) of the GPU an estimate runs on when no catalog GPU is named: 1 PiB, so
#: nothing runs out and the peak is the step's own.
UNBOUNDED = 1 << 50


def target_spec(gpu: str | None = None) -> GpuSpec:
    """The GPU the CUDA target simulates (see the module doc); ``UsageError`` names an
    unknown one."""
    if gpu is None or gpu.lower() in GPU_ARCHITECTURES:
        arch = (gpu or "ampere").lower()
        major, minor = (int(part) for part in GPU_ARCHITECTURES[arch].split("."))
        return GpuSpec(
            name=f"{arch} (unbounded memory)",
            total_memory=UNBOUNDED,
            capability=(major, minor),
            cublas_workspace=workspace_default((major, minor)),
            context_bytes=0,
            multiprocessors=multiprocessors_of((major, minor)),
            source="the estimator's default: no capacity, so the peak is the step's own",
            device_name=f"Simulated {arch.capitalize()} GPU",
        )
    try:
        return parse_gpu(gpu)
    except UsageError as exc:
        if not str(exc).startswith("unknown GPU"):
            raise
        names = ", ".join(spec.name for spec in GPUS.values())
        raise UsageError(
            f"unknown GPU {gpu!r}: choose an architecture ({', '.join(GPU_ARCHITECTURES)}; memory "
            f"unbounded), a GPU ({names}) or SIZE:smXY such as 24GiB:sm86"
        ) from None


def workspace_size(spec: GpuSpec, cublas_workspace: int | str | None) -> int:
    """Bytes of one cuBLAS workspace: ``cublas_workspace`` as bytes or a
    ``CUBLAS_WORKSPACE_CONFIG`` value, else that environment variable, else the GPU's
    default."""
    if isinstance(cublas_workspace, int):
        if cublas_workspace < 0:
            raise UsageError(f"the cuBLAS workspace cannot be {cublas_workspace} bytes")
        return cublas_workspace
    config = cublas_workspace if cublas_workspace is not None else os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    return workspace_bytes(None, config) if config else spec.cublas_workspace


def capacity_text(spec: GpuSpec) -> str:
    """What the capacity of ``spec`` is, with the figures and where the non-PyTorch one
    comes from (the catalog's, or a saved probe result: ``catalog.parse_gpu``)."""
    return (
        f"{spec.name}'s capacity: total memory {format_bytes(spec.total_memory)} less "
        f"{format_bytes(spec.non_pytorch_bytes)} of non-PyTorch memory, the CUDA context and "
        f"cuBLAS/cuDNN handles; {spec.context_source or 'not measured'}"
    )


class DoesNotFit(UsageError):
    """The step ran out of the named GPU's memory (``torch.OutOfMemoryError`` on the
    simulated GPU); ``record`` is the simulated GPU's
    :class:`~gpu_mem_track.simgpu.records.OutOfMemory`."""

    def __init__(self, message: str, record: Any) -> None:
        super().__init__(message)
        self.record = record


def _does_not_fit(spec: GpuSpec, record: Any, user_code: bool) -> DoesNotFit:
    where = f" at {record.filename}:{record.line}" if record.filename and user_code else ""
    return DoesNotFit(
        f"the step does not fit on {spec.name}: it would run out of memory{where} asking "
        f"{format_bytes(record.request)} with {format_bytes(record.allocated)} allocated and "
        f"{format_bytes(record.reserved)} reserved of {format_bytes(record.capacity)} "
        f"({capacity_text(spec)})",
        record,
    )


@dataclass
class Target:
    """Where one simulated step runs: ``tracker`` follows its storages, ``values`` (None
    on real tensors) answers reads of meta tensors' values, ``gpu`` is the simulated
    GPU (None on the CPU target); ``user_code``: the step is the user's, so the line
    where it ran out of memory is theirs. Enter :meth:`running` around the step."""

    tracker: Lifetimes
    values: KnownValues | None
    gpu: Any = None
    user_code: bool = False

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The step's context: the simulated GPU (its values, tracker and CUDA face), or
        the values and the tracker alone."""
        if self.gpu is not None:
            try:
                with self.gpu:
                    yield
            except torch.OutOfMemoryError:
                if self.gpu.out_of_memory is None:
                    raise
                raise _does_not_fit(self.gpu.spec, self.gpu.out_of_memory, self.user_code) from None
        else:
            with self.values or contextlib.nullcontext(), self.tracker:
                yield

    def close(self) -> None:
        """Stop following storages (see ``Lifetimes.close``)."""
        self.tracker.close()


def _no_cuda_memory_model(options: StepOptions) -> None:
    """``UsageError`` for a CUDA memory model given to the CPU target, which would ignore it
    (the environment variables, read only on the CUDA target, are no mistake)."""
    given = (
        ("the simulated GPU (--gpu, gpu)", options.gpu),
        ("the allocator settings (--alloc-conf, alloc_conf)", options.alloc_conf),
        ("the cuBLAS workspace (--cublas-workspace, cublas_workspace)", options.cublas_workspace),
    )
    for what, value in given:
        if value is not None:
            raise UsageError(f"{what} is the CUDA target's: it does not apply to {options.device}")


def open_target(options: StepOptions, sim: str, user_code: bool = False) -> Target:
    """The device of ``options.target`` for tensors on ``sim`` (``"meta"``, or ``"cpu"``
    for a real CPU step); ``user_code``: the step is the user's."""
    if options.target != "cuda" and options.amp is not None and sim == "meta":
        raise UsageError(f"autocast (--amp, amp) is CUDA's: it needs the CUDA target, not {options.device}")
    if options.target != "cuda" and sim == "meta":  # exact sizes: a CUDA memory model given is unused
        _no_cuda_memory_model(options)
    if options.target != "cuda" or sim != "meta":
        tracker = Lifetimes({sim, "cpu"}, ExactMemory())
        return Target(tracker, KnownValues(tracker.module) if sim == "meta" else None)
    from ..simgpu.session import SimulatedGpu

    spec = target_spec(options.gpu)
    workspace = workspace_size(spec, options.cublas_workspace)
    gpu = SimulatedGpu(spec, options.alloc_conf)
    gpu.storages.history = True  # the estimate reads every birth and death (roles, phases)
    gpu.storages.workspace = CublasWorkspace(workspace, {})
    gpu.values.where = gpu.storages.module
    return Target(gpu.storages, gpu.values, gpu, user_code)
