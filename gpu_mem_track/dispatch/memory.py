"""Where the estimator's storages live: the device memory a storage is taken from.

:class:`~gpu_mem_track.dispatch.lifetimes.Lifetimes` asks a device memory for every
storage born (``take(nbytes)``) and gives it back when the storage dies. On the CPU
target (:class:`ExactMemory`) a storage counts its exact bytes. On the CUDA target the
memory is the simulated GPU's (:class:`~gpu_mem_track.simgpu.engine.GpuMemory`: every
storage a ``malloc`` on the caching-allocator model, see
:mod:`~gpu_mem_track.estimator.target`). :func:`alloc_settings` reads a
``PYTORCH_CUDA_ALLOC_CONF`` value for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

from ..allocator import Allocator, AllocatorSettings, parse_alloc_conf
from ..gpumodel.workspace import CublasWorkspace

__all__ = ["CublasWorkspace", "ExactMemory", "StorageMemory", "alloc_settings"]


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
