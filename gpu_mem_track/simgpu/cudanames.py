"""Two helpers of the simulated ``torch.cuda`` (:mod:`~gpu_mem_track.simgpu.cudaapi`) and
of the rest of its surface (:mod:`~gpu_mem_track.simgpu.surface`), kept below both:
setting a name where torch binds it twice, and the allocator's statistics as the nested
dict ``torch._C._cuda_memoryStats`` returns."""

from __future__ import annotations

from typing import Any

import torch

from .patches import Patches

__all__ = ["nested_stats", "set_both"]


def set_both(patches: Patches, name: str, value: Any) -> None:
    """``torch.cuda.name`` and ``torch.cuda.memory.name`` (the same function, two bindings)."""
    patches.set(torch.cuda, name, value)
    if hasattr(torch.cuda.memory, name):
        patches.set(torch.cuda.memory, name, value)


def nested_stats(flat: dict[str, int]) -> dict[str, Any]:
    """``{"a.b.c": n}`` as ``{"a": {"b": {"c": n}}}``: the shape of torch's nested statistics."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out
