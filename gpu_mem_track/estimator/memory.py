"""Where the estimator's storages live: exact sizes, or the CUDA caching allocator's model.

:class:`~gpu_mem_track.estimator.lifetimes.Lifetimes` asks a device memory for every
storage born (``take(nbytes)``) and gives it back when the storage dies. On the CPU
target (:class:`ExactMemory`) a storage counts its exact bytes. On the CUDA target
(:class:`CachingMemory`) every storage is a ``malloc`` of its ``nbytes`` on the
simulated caching allocator (``gpu_mem_track.allocator``): it counts the block handed
out (512 B rounding, and a large block up to 1 MiB over the request handed out whole),
and the allocator's segments give *reserved* memory.

The cuBLAS workspaces are modelled in :mod:`~gpu_mem_track.gpumodel.workspace` (one per
handle and stream: forward and backward), shared with the simulated GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..allocator import Allocator, AllocatorSettings, parse_alloc_conf
from ..errors import UsageError
from ..gpumodel.workspace import (
    BLAS_OPS,
    DEFAULT_WORKSPACE,
    GPU_ARCHITECTURES,
    HOPPER_WORKSPACE,
    CublasWorkspace,
    workspace_bytes,
)

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
