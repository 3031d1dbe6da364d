"""The cuBLAS workspaces, as PyTorch allocates them. Torch-free.

PyTorch gives each (cuBLAS handle, stream) pair one workspace, allocated through the
caching allocator when the handle is first used by a matmul-like op and never freed
(``at::cuda::getCurrentCUDABlasHandle`` in ``aten/src/ATen/cuda/CublasHandlePool.cpp``).
Handles are per thread, and on CUDA autograd runs backward on its own device thread, so
the forward and the backward passes each get one (:class:`CublasWorkspace`). The size
is ``CUBLAS_WORKSPACE_CONFIG`` when set, else 32 MiB on compute capability 9.0 and
newer, else 8,519,680 B (:func:`workspace_bytes`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import UsageError

__all__ = [
    "BLAS_OPS",
    "DEFAULT_WORKSPACE",
    "GPU_ARCHITECTURES",
    "HOPPER_WORKSPACE",
    "CublasWorkspace",
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
