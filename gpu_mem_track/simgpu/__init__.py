"""A simulated GPU: run unmodified PyTorch code as if ``cuda:0`` were a named GPU.

``with simulated_gpu("a100-40gb") as gpu:`` runs the block with tensors put on CUDA
simulated (shapes, dtypes, no data), every storage allocated from the caching-allocator
model with that GPU's capacity, ``torch.cuda`` answering from the simulation, CUDA's
autocast lists, attention backends and cuBLAS workspaces, and
``torch.OutOfMemoryError`` raised where the GPU would run out. ``GPUS`` is the catalog,
``parse_gpu`` reads a name or ``SIZE:smXY``. Importing this package does not import
torch; ``simulated_gpu`` and ``SimulatedGpu`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .catalog import GPUS, GpuSpec, parse_gpu
from .records import Bound, Compiled, OutOfMemory, Placeholder

if TYPE_CHECKING:
    from .session import SimulatedGpu, simulated_gpu

__all__ = [
    "GPUS",
    "Bound",
    "Compiled",
    "GpuSpec",
    "OutOfMemory",
    "Placeholder",
    "SimulatedGpu",
    "parse_gpu",
    "simulated_gpu",
]


def __getattr__(name: str) -> Any:
    if name in ("SimulatedGpu", "simulated_gpu"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
