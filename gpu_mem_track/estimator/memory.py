"""Where the estimator's storages live: exact sizes, or the CUDA caching allocator's model.

:class:`~gpu_mem_track.estimator.lifetimes.Lifetimes` asks a device memory for every
storage born (``take(nbytes)``) and gives it back when the storage dies. On the CPU
target (:class:`ExactMemory`) a storage counts its exact bytes. On the CUDA target
(:class:`CachingMemory`) every storage is a ``malloc`` of its ``nbytes`` on the
simulated caching allocator (``gpu_mem_track.allocator``): it counts the block handed
out (512 B rounding, and a large block up to 1 MiB over the request handed out whole),
and the allocator's segments give *reserved* memory.

The cuBLAS workspace (:class:`CublasWorkspace`): PyTorch gives each (cuBLAS handle,
stream) pair one workspace, allocated through the caching allocator when the handle is
first used by a matmul-like op and never freed (``at::cuda::getCurrentCUDABlasHandle``
in ``aten/src/ATen/cuda/CublasHandlePool.cpp``). Handles are per thread, and on CUDA
autograd runs backward on its own device thread, so the forward and the backward passes
each get one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..allocator import Allocator, AllocatorSettings, parse_alloc_conf
from ..errors import UsageError

__all__ = [
    "BLAS_OPS",
    "DEFAULT_WORKSPACE",
    "GPU_ARCHITECTURES",
    "HOPPER_WORKSPACE",
    "CachingMemory",
    "CublasWorkspace",
    "ExactMemory",
    "StorageMemory",
    "alloc_settings",
    "workspace_bytes",
]

#: aten ops that run a cuBLAS (or cuBLASLt) routine on CUDA (``aten/src/ATen/native/cuda/Blas.cpp``
#: calling ``at::cuda::blas``): the GEMMs behind ``linear``, ``matmul``, ``einsum`` and
#: attention's math path, matrix-vector products and dot products.
BLAS_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "_addmm_activation",
        "_scaled_mm",
        "_int_mm",
    }
)

#: The default ``CUBLAS_WORKSPACE_CONFIG`` ``:4096:2:16:8``: 2 x 4096 KiB + 8 x 16 KiB.
DEFAULT_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
#: The default on compute capability 9.0 (Hopper, H100/H200): 4096 KiB x 8 = 32 MiB.
HOPPER_WORKSPACE = 4096 * 1024 * 8

#: ``--gpu`` names and their compute capabilities. Only 9.0 gets the 32 MiB default in
#: PyTorch's source (``sm90`` in ``parseChosenWorkspaceSize``); the others get 8,519,680 B.
GPU_ARCHITECTURES = {
    "volta": "7.0",
    "turing": "7.5",
    "ampere": "8.0",
    "ada": "8.9",
    "hopper": "9.0",
    "blackwell": "10.0",
}


def workspace_bytes(gpu: str | None = None, config: str | None = None) -> int:
    """The bytes of one cuBLAS workspace, as PyTorch chooses them.

    ``config`` is a ``CUBLAS_WORKSPACE_CONFIG`` value (``":4096:8"``, ``":4096:2:16:8"``:
    the sum of SIZE KiB x COUNT over its ``:SIZE:COUNT`` pairs); None reads the
    environment variable. Without one, the default for ``gpu`` (a name of
    ``GPU_ARCHITECTURES``; None: not Hopper). ``"0"``-sized configs give 0 (no workspace).
    """
    if gpu is not None and gpu not in GPU_ARCHITECTURES:
        raise UsageError(f"unknown GPU architecture {gpu!r} (choose from {', '.join(GPU_ARCHITECTURES)})")
    if config is None:
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    default = HOPPER_WORKSPACE if gpu == "hopper" else DEFAULT_WORKSPACE
    if not config:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        raise UsageError(f"CUBLAS_WORKSPACE_CONFIG {config!r}: expected :SIZE:COUNT pairs, e.g. :4096:8")
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def alloc_settings(conf: str | None = None) -> AllocatorSettings:
    """Allocator settings from a ``PYTORCH_CUDA_ALLOC_CONF`` value (None: the environment
    variable, defaults when unset); ``UsageError`` names a bad one."""
    if conf is None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return parse_alloc_conf(conf)


class StorageMemory(Protocol):
    """Where storages live: ``take(nbytes)`` returns a handle and the bytes the storage
    counts, ``give_back(handle)`` releases it; ``reserved`` and ``largest_free_block()``
    describe the cache (0 without one); ``allocator`` is the simulated caching allocator
    (None without one)."""

    allocator: Allocator | None

    def take(self, nbytes: int) -> tuple[int, int]: ...

    def give_back(self, handle: int) -> None: ...

    @property
    def reserved(self) -> int: ...

    def largest_free_block(self) -> int: ...


class ExactMemory:
    """Storages count ``size_of(nbytes)`` (exact sizes by default); no segments."""

    allocator = None

    def __init__(self, size_of: Callable[[int], int] = lambda nbytes: nbytes) -> None:
        self.size_of = size_of

    def take(self, nbytes: int) -> tuple[int, int]:
        """A handle (always 0) and the bytes the storage counts."""
        return 0, self.size_of(nbytes)

    def give_back(self, handle: int) -> None:
        """Nothing to release."""

    @property
    def reserved(self) -> int:
        return 0

    def largest_free_block(self) -> int:
        return 0


class CachingMemory:
    """Storages are blocks of a simulated caching allocator (``allocator``)."""

    def __init__(self, settings: AllocatorSettings | None = None) -> None:
        self.allocator = Allocator(settings)

    def take(self, nbytes: int) -> tuple[int, int]:
        """``malloc(nbytes)``: the block's address and its bytes (0, 0 for 0 bytes)."""
        before = self.allocator.allocated
        address = self.allocator.malloc(nbytes)
        return address, self.allocator.allocated - before

    def give_back(self, handle: int) -> None:
        """``free`` the block at ``handle`` (nothing for a 0-byte storage)."""
        if handle:
            self.allocator.free(handle)

    @property
    def reserved(self) -> int:
        """Bytes of all segments (``memory_reserved()``)."""
        return self.allocator.reserved

    def largest_free_block(self) -> int:
        """The largest cached free block (bytes)."""
        return self.allocator.largest_free_block()


@dataclass
class CublasWorkspace:
    """One cuBLAS workspace of ``nbytes`` per handle: ``"forward"`` (the caller's thread)
    and ``"backward"`` (autograd's device thread); ``blocks`` holds the bytes each got."""

    nbytes: int
    blocks: dict[str, int]

    def needed(self, op: str, in_backward: bool) -> str | None:
        """The handle whose workspace ``op`` would allocate now (None: none, or already done)."""
        if not self.nbytes or op not in BLAS_OPS:
            return None
        handle = "backward" if in_backward else "forward"
        return None if handle in self.blocks else handle

    @property
    def total(self) -> int:
        """Bytes of all workspaces allocated so far."""
        return sum(self.blocks.values())


@dataclass(frozen=True)
class CudaModel:
    """How the CUDA target's memory is modelled: the caching allocator's ``settings``
    (as a ``PYTORCH_CUDA_ALLOC_CONF`` string, ``""`` for the defaults) and the bytes of
    one cuBLAS ``workspace`` (0: none). Build it with :meth:`parse`."""

    alloc_conf: str = ""
    workspace: int = DEFAULT_WORKSPACE

    @classmethod
    def parse(
        cls,
        alloc_conf: str | None = None,
        gpu: str | None = None,
        cublas_workspace: int | str | None = None,
    ) -> CudaModel:
        """``alloc_conf``: a ``PYTORCH_CUDA_ALLOC_CONF`` value (None: the environment
        variable); ``gpu``: an architecture name (``GPU_ARCHITECTURES``) for the default
        workspace; ``cublas_workspace``: bytes, or a ``CUBLAS_WORKSPACE_CONFIG`` value
        (None: the environment variable, else the architecture's default)."""
        settings = alloc_settings(alloc_conf)
        if isinstance(cublas_workspace, int):
            if cublas_workspace < 0:
                raise UsageError(f"the cuBLAS workspace cannot be {cublas_workspace} bytes")
            workspace = cublas_workspace
        else:
            workspace = workspace_bytes(gpu, cublas_workspace)
        return cls(settings.conf_string(), workspace)

    def memory(self) -> CachingMemory:
        """A fresh simulated caching allocator with these settings."""
        return CachingMemory(parse_alloc_conf(self.alloc_conf))

    def workspaces(self) -> CublasWorkspace:
        """Fresh (not yet allocated) cuBLAS workspaces of this size."""
        return CublasWorkspace(self.workspace, {})
