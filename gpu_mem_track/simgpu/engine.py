"""The dispatch side of the simulated GPU: every storage of a simulated tensor is a block
of the caching-allocator model, sized to the GPU's capacity.

:class:`GpuMemory` is the device memory the storage tracker
(:class:`~gpu_mem_track.dispatch.lifetimes.Lifetimes`) takes storages from: a
``malloc`` on :class:`~gpu_mem_track.allocator.Allocator` with capacity
``GpuSpec.capacity`` (total memory less the non-PyTorch memory), whose segments the driver
places top-down (:mod:`~gpu_mem_track.gpumodel.addresses`). When even the allocator's retry (free the cached
segments) cannot serve a request it raises ``torch.OutOfMemoryError`` with PyTorch's
message (``c10/cuda/CUDACachingAllocator.cpp``; the size asked for is the segment the
allocator needed, as there) and records it. While history is recorded
(``torch.cuda.memory._record_memory_history``), every allocator action becomes a trace
entry with the Python stack and time, as a real snapshot has; otherwise the allocator's
event log is dropped as it grows, so a long script keeps no history.

:class:`Storages` is the tracker run with torch functions off inside it, so the
tracker's own property reads see meta tensors as meta (the face says ``cuda``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..allocator import Allocator, AllocatorSettings, SimulatedOutOfMemory, allocation_size
from ..dispatch.lifetimes import WORKSPACE, Lifetimes
from ..gpumodel.addresses import TopDownDevice
from ..gpumodel.attention import CUDNN_FORWARD, kernel_scratch
from ..gpumodel.convops import CONVOLUTION_OPS, convolution_plan, cudnn_settings
from ..gpumodel.cudnn import CudnnConvolutions, Step
from ..gpumodel.reduce import (
    float_result_first,
    lt_workspace_bytes,
    staging_bytes,
    threads_per_multiprocessor,
)
from ..snapshotfile.records import Frame, TraceEntry
from .catalog import GpuSpec
from .records import OutOfMemory
from .usermeta import MetaTensors
from .virtual import VirtualCpu

__all__ = ["CUDNN_WORKSPACE", "GpuMemory", "Storages", "format_size", "oom_message", "user_line"]

#: ``born_in`` phase of cuDNN's workspaces (allocated and freed inside a convolution).
CUDNN_WORKSPACE = "cuDNN workspace"
#: Sums whose staging blocks are modelled (:mod:`~gpu_mem_track.gpumodel.reduce`).
SUM_OPS = frozenset({torch.ops.aten.sum.dim_IntList})
_ADDMM = torch.ops.aten.addmm.default

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_OUR_DIR = str(Path(__file__).resolve().parents[1])
_SKIPPED = (_TORCH_DIR, _OUR_DIR, "<frozen ")


def _torch_frame(function: Callable[..., Any]) -> tuple[Frame, ...]:
    """The frame of a torch Python function as a recorded stack shows it (its last line,
    the call into C++)."""
    code = function.__code__
    last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
    return (Frame(code.co_filename, last, code.co_name),)


_EMPTY_CACHE_FRAME = _torch_frame(torch.cuda.memory.empty_cache)


def user_line(skipped: tuple[str, ...] = _SKIPPED) -> tuple[str, int]:
    """(filename, line) of the innermost frame outside torch and this package."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skipped):
            return name, frame.f_lineno
        frame = frame.f_back
    return "", 0


def python_frames(limit: int = 64) -> tuple[Frame, ...]:
    """The Python stack, innermost first (as a snapshot's frames), without this package's."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < limit:
        name = frame.f_code.co_filename
        if not name.startswith(_OUR_DIR):
            frames.append(Frame(name, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(frames)


def format_size(size: int) -> str:
    """A size as PyTorch's allocator messages print it (``format_size`` in c10)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def oom_message(
    request: int, allocated: int, reserved: int, spec: GpuSpec, allowed: int | None = None
) -> str:
    """``torch.OutOfMemoryError``'s text for the simulated GPU, as ``malloc`` of
    ``c10/cuda/CUDACachingAllocator.cpp`` writes it once the release and the retry have
    failed, so ``allocated`` and ``reserved`` are the bytes left after the release
    (:mod:`~gpu_mem_track.allocator.recovery`). ``request``: the segment asked for
    (``get_allocation_size``). Device 0; this process is the only one, so "of which X is
    free" (``cudaMemGetInfo``) is the total less the reserved bytes and the non-PyTorch
    memory (the CUDA context and library handles: ``GpuSpec.non_pytorch_bytes``), and
    "this process has Y memory in use" (NVML) is the reserved bytes plus that memory.
    ``allowed``: the limit ``set_per_process_memory_fraction`` set, if any (the
    "Z allowed; " part, absent otherwise); the free figure is the device's, not what the
    fraction leaves."""
    free = max(spec.capacity - reserved, 0)
    limit = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    return (
        f"CUDA out of memory. Tried to allocate {format_size(request)}. GPU 0 has a total capacity of "
        f"{format_size(spec.total_memory)} of which {format_size(free)} is free. "
        f"Including non-PyTorch memory, this process has {format_size(reserved + spec.non_pytorch_bytes)} "
        f"memory in use. {limit}Of the allocated memory {format_size(allocated)} is allocated by PyTorch, "
        "and "
        f"{format_size(reserved - allocated)} is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
        "avoid fragmentation.  See documentation for Memory Management  "
        "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    )


class GpuMemory:
    """Storages as blocks of the caching-allocator model of ``spec`` (see the module
    doc). ``on_oom`` hears each out-of-memory record before the error is raised."""

    def __init__(
        self,
        spec: GpuSpec,
        settings: AllocatorSettings | None = None,
        on_oom: Callable[[OutOfMemory], None] | None = None,
    ) -> None:
        self.spec = spec
        device = TopDownDevice(spec.capacity)
        self.allocator = Allocator(settings, device=device, total_memory=spec.total_memory)
        self.on_oom = on_oom
        self.history: list[TraceEntry] | None = None
        self.max_entries = sys.maxsize
        self.block_frames: dict[int, tuple[Frame, ...]] = {}
        self.start = time.perf_counter()
        self.window_allocated = self.window_reserved = 0

    def mark(self) -> tuple[int, int]:
        """Start a new window: returns the (allocated, reserved) peaks of the window that
        ends, and restarts both from the current bytes. A line sampler reads a line's
        peaks so, leaving torch's own peak statistics (``max_memory_allocated``) alone."""
        peaks = (self.window_allocated, self.window_reserved)
        self.window_allocated, self.window_reserved = self.allocator.allocated, self.allocator.reserved
        return peaks

    def set_fraction(self, fraction: float) -> None:
        """``set_per_process_memory_fraction``: the allocator may reserve at most
        ``fraction`` x ``total_memory`` (``setMemoryFraction``: the CUDA context and
        libraries are not counted against it, but still take their share of the device,
        so it never gets more than ``spec.capacity``); 1 removes the limit. See
        :mod:`~gpu_mem_track.allocator.recovery`."""
        self.allocator.set_memory_fraction(fraction, self.spec.total_memory)

    @property
    def allowed(self) -> int | None:
        """The memory fraction's limit in bytes (None: none set)."""
        return self.allocator.allowed

    def record(self, enabled: bool, max_entries: int = sys.maxsize) -> None:
        """Start (keeping what was recorded) or stop recording the trace."""
        if enabled and self.history is None:
            self.history = []
        elif not enabled:
            self.history = None
            self.block_frames.clear()
        self.max_entries = max_entries

    def take(self, nbytes: int) -> tuple[int, int]:
        """``malloc(nbytes)``: the block's address and the bytes it counts."""
        allocator = self.allocator
        before, seen = allocator.allocated, len(allocator.events)
        try:
            address = allocator.malloc(nbytes)
        except SimulatedOutOfMemory as exc:
            self._trace(seen, exc)
            raise self._out_of_memory(exc) from None
        self._trace(seen)
        if self.history is not None and address:
            self.block_frames[address] = self._frames_of_last()
        if allocator.allocated > self.window_allocated:
            self.window_allocated = allocator.allocated
        if allocator.reserved > self.window_reserved:
            self.window_reserved = allocator.reserved
        return address, allocator.allocated - before

    def give_back(self, handle: int) -> None:
        """``free`` the block at ``handle`` (nothing for 0 bytes)."""
        if handle:
            seen = len(self.allocator.events)
            self.allocator.free(handle)
            self.block_frames.pop(handle, None)
            self._trace(seen)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: release every unused cached segment; while history
        is recorded each release is a ``segment_free`` entry whose stack starts in
        ``torch.cuda.memory.empty_cache``, as a real recording's does (a replay groups the
        entries into the one call by that frame)."""
        seen = len(self.allocator.events)
        self.allocator.empty_cache()
        self._trace(seen, top=_EMPTY_CACHE_FRAME)

    @property
    def reserved(self) -> int:
        return self.allocator.reserved

    def largest_free_block(self) -> int:
        return self.allocator.largest_free_block()

    def _frames_of_last(self) -> tuple[Frame, ...]:
        history = self.history
        return history[-1].frames if history else ()

    def _trace(self, seen: int, oom: SimulatedOutOfMemory | None = None, top: tuple[Frame, ...] = ()) -> None:
        events = self.allocator.events
        if self.history is None:
            events.clear()
            return
        frames = top + python_frames()
        now = int((time.perf_counter() - self.start) * 1e6)
        for event in events[seen:]:
            addr = (
                max(self.spec.capacity - self.allocator.reserved, 0)
                if event.action == "oom"
                else event.address
            )
            free = addr if event.action == "oom" else None
            self.history.append(TraceEntry(event.action, addr, event.size, event.stream, now, frames, free))
        events.clear()
        if len(self.history) > self.max_entries:
            del self.history[: len(self.history) - self.max_entries]

    def _out_of_memory(self, exc: SimulatedOutOfMemory) -> torch.OutOfMemoryError:
        request = allocation_size(exc.size)
        message = oom_message(request, exc.allocated, exc.reserved, self.spec, self.allowed)
        filename, line = user_line()
        limit = self.allocator.limit  # the capacity, or less under a memory fraction
        record = OutOfMemory(filename, line, request, exc.allocated, exc.reserved, limit, message)
        if self.on_oom is not None:
            self.on_oom(record)
        return torch.OutOfMemoryError(message)


class Storages(Lifetimes):
    """:class:`~gpu_mem_track.dispatch.lifetimes.Lifetimes` on the meta device with
    torch functions off while it works (see the module doc). Outputs of ops made as
    virtual CPU tensors (``virtual.making``) or computed from virtual CPU tensors only
    are virtual too and count nowhere (:mod:`~gpu_mem_track.simgpu.virtual`). Kernels'
    scratch blocks (:func:`~gpu_mem_track.gpumodel.attention.kernel_scratch`) are taken
    and given back right after their op. Convolutions take cuDNN's workspaces and
    benchmark trials around their outputs (:mod:`~gpu_mem_track.gpumodel.cudnn`;
    ``convolutions`` holds the benchmark cache). Sums take CUDA's reduction staging
    blocks, and an ``addmm`` with a bias vector cuBLASLt's workspace
    (:mod:`~gpu_mem_track.gpumodel.reduce`)."""

    def __init__(
        self, memory: GpuMemory, workspace: Any, virtual: VirtualCpu, meta: MetaTensors | None = None
    ) -> None:
        super().__init__({"meta"}, memory, workspace, history=False)
        self.virtual = virtual
        self.meta = meta if meta is not None else MetaTensors()
        self.capability = memory.spec.capability
        self.convolutions = CudnnConvolutions()
        self.multiprocessors = memory.spec.multiprocessors
        self.threads_per_multiprocessor = threads_per_multiprocessor(self.capability)
        self.lt_handles: set[str] = set()  # handles (forward, backward) given a cuBLASLt workspace

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with torch._C.DisableTorchFunction():
            virtual, meta = self.virtual, self.meta
            onto_gpu = meta.gpu  # a call onto the simulated GPU: GPU outputs whatever the inputs
            if virtual.making or (virtual and not onto_gpu and self._from_virtual(args, kwargs)):
                return self._uncounted(virtual, func, args, kwargs)
            if meta.making or (meta and not onto_gpu and self._from_meta(args, kwargs)):
                return self._uncounted(meta, func, args, kwargs)
            if func in CONVOLUTION_OPS:
                return self._convolution(func, args, kwargs or {})
            if func in SUM_OPS and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                return self._sum(func, types, args, kwargs)
            if func is CUDNN_FORWARD and args[0].is_meta:
                out = self._seed_first(func, args, kwargs or {})
            else:
                out = super().__torch_dispatch__(func, types, args, kwargs)
            if (
                func is _ADDMM
                and isinstance(args[0], torch.Tensor)
                and args[0].is_meta
                and args[0].dim() == 1
            ):
                self._lt_workspace(kwargs or {})
            scratch = kernel_scratch(func, args, self.capability)
            if scratch:
                self._scratch(scratch, str(func.overloadpacket.__name__))
            return out

    def _scratch(self, nbytes: int, op: str) -> None:
        """A kernel's scratch block: taken after the op's outputs, freed at once."""
        key = self._new_key(nbytes, 0)
        self._note_peak(op)
        self._release(key)

    def _seed_first(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """cuDNN attention: its seed and offset registered before its other outputs,
        as CUDA allocates them (:mod:`~gpu_mem_track.gpumodel.attention`)."""
        out = func(*args, **kwargs)
        leaves = [leaf for i in (6, 7, 0, 1) for leaf in tree_leaves(out[i])]
        grew = False
        for leaf in [*leaves, *tree_leaves(out)]:
            if isinstance(leaf, torch.Tensor):
                grew |= self._register(leaf) is not None
        if grew:
            self._note_peak(str(func.overloadpacket.__name__))
        return out

    def _sum(self, func: Any, types: Any, args: tuple, kwargs: Any) -> Any:
        """A sum with CUDA's staging blocks around it; in backward, a half-precision
        sum's float32 result first (:mod:`~gpu_mem_track.gpumodel.reduce`)."""
        source = args[0]
        dims = args[1] if len(args) > 1 and args[1] is not None else list(range(source.dim()))
        reduced = sorted({d % source.dim() for d in dims} or range(source.dim())) if source.dim() else []
        staging = staging_bytes(
            tuple(source.shape),
            reduced,
            source.is_contiguous(),
            self.multiprocessors,
            self.threads_per_multiprocessor,
        )
        in_backward = torch._C._current_graph_task_id() != -1
        float_first = float_result_first(source.element_size(), source.is_floating_point(), in_backward)
        wanted = (kwargs or {}).get("dtype")
        first = None
        if float_first and wanted in (None, source.dtype):
            outputs = source.numel() // max(1, _product(source.shape[d] for d in reduced))
            first = self._new_key(4 * outputs, 0)
            self._note_peak("sum")
            self._staging(staging)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if first is None:
            self._staging(staging)
        else:
            self._release(first)
        return out

    def _staging(self, staging: Any) -> None:
        """A reduction's staging buffer and semaphores: taken, then freed (the
        semaphores first, as the recording shows)."""
        keys = [self._new_key(n, 0) for n in (staging.buffer, staging.semaphores) if n]
        if keys:
            self._note_peak("sum")
        for key in reversed(keys):
            self._release(key)

    def _lt_workspace(self, kwargs: dict) -> None:
        """cuBLASLt's workspace, once per handle, after an ``addmm`` with a bias vector
        and beta 1 (its bias epilogue), kept to the end as the cuBLAS one is, and counted
        with it (``workspace_keys``: the estimate's ``cublas_workspace``)."""
        handle = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        if handle in self.lt_handles or kwargs.get("beta", 1) != 1 or not self.workspace.nbytes:
            return  # workspaces switched off (a cuBLAS workspace of 0, as the estimator sets): none
        self.lt_handles.add(handle)
        self.workspace_keys.add(self._new_key(lt_workspace_bytes(), 0, WORKSPACE))
        self._note_peak("addmm")

    def _from_virtual(self, args: Any, kwargs: Any) -> bool:
        metas = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_meta]
        return bool(metas) and all(self.virtual.holds(t) for t in metas)

    def _from_meta(self, args: Any, kwargs: Any) -> bool:
        """Whether the op's meta inputs are all the program's own meta tensors."""
        metas = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_meta]
        return bool(metas) and all(self.meta.holds(t) for t in metas)

    @staticmethod
    def _uncounted(holder: Any, func: Any, args: Any, kwargs: Any) -> Any:
        """Run ``func``; its meta outputs go to ``holder`` (virtual CPU or the program's
        meta tensors) and count on no device."""
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.is_meta:
                holder.add(leaf)
        return out

    # cuDNN convolutions (gpumodel.cudnn): each output counted, then its problem's steps.

    def _convolution(self, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        op = str(func.overloadpacket.__name__)
        in_backward = torch._C._current_graph_task_id() != -1
        _, benchmark, empty_cache = cudnn_settings()
        on_gpu = isinstance(args[0], torch.Tensor) and args[0].is_meta  # not a real CPU convolution
        for tensor, problem in (
            convolution_plan(func, args, out, in_backward, self.capability) if on_gpu else ()
        ):
            if self._register(tensor) is not None:
                self._note_peak(op)
            for step in self.convolutions.steps(problem, benchmark, empty_cache):
                self._cudnn_step(step, op)
        for leaf in tree_leaves(out):  # the rest (bias gradient), or all without cuDNN
            if isinstance(leaf, torch.Tensor) and self._register(leaf) is not None:
                self._note_peak(op)
        return out

    def _cudnn_step(self, step: Step, op: str) -> None:
        """A trial (the largest size that fits, halved while it fails), the benchmark's
        ``emptyCache()``, or the run's workspace (none when it does not fit: cuDNN falls
        back to a plan without one); each allocated and freed at once. Failed attempts
        are not reported as the run's out-of-memory (PyTorch catches them)."""
        memory = self.memory
        if step.action == "empty_cache":
            memory.empty_cache()
            return
        nbytes = step.nbytes
        if step.action == "trial":
            capacity = memory.allocator.limit
            free = capacity - memory.reserved if capacity is not None else nbytes
            nbytes = min(nbytes, max(free, memory.largest_free_block()))
        on_oom, memory.on_oom = memory.on_oom, None
        try:
            while nbytes > 0:
                try:
                    key = self._new_key(nbytes, 0, CUDNN_WORKSPACE)
                except torch.OutOfMemoryError:
                    nbytes = nbytes // 2 if step.action == "trial" else 0
                    continue
                self._note_peak(op)
                self._release(key)
                return
        finally:
            memory.on_oom = on_oom


def _product(sizes: Any) -> int:
    result = 1
    for size in sizes:
        result *= size
    return result
