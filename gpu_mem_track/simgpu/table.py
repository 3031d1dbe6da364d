"""The GPU catalog as a table (``gpu-mem-track gpus``): a renderer, torch-free."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..units import format_bytes
from .catalog import GpuSpec

__all__ = ["gpus_dict", "render_gpus"]

_HEAD = (
    "GPU",
    "Device name",
    "Total memory",
    "CC",
    "cuBLAS workspace",
    "CUDA context",
    "cuBLAS/cuDNN",
    "Capacity",
)


def render_gpus(specs: Sequence[GpuSpec]) -> str:
    """One row per GPU: name, what ``torch.cuda.get_device_name`` says, total memory as
    torch reports it, compute capability, cuBLAS workspace per handle and stream, the
    non-PyTorch memory (CUDA context, cuBLAS/cuDNN handles; "-" where the context's
    figure includes them) and the allocator's capacity (total less the non-PyTorch
    memory); then where each figure comes from."""
    rows = [
        (
            spec.name,
            spec.device_name,
            format_bytes(spec.total_memory),
            f"{spec.capability[0]}.{spec.capability[1]}",
            format_bytes(spec.cublas_workspace),
            format_bytes(spec.context_bytes),
            format_bytes(spec.library_bytes) if spec.library_bytes else "-",
            format_bytes(spec.capacity),
        )
        for spec in specs
    ]
    widths = [max(len(row[i]) for row in [_HEAD, *rows]) for i in range(len(_HEAD))]
    left = (True, True, False, False, False, False, False, False)

    def line(cells: tuple[str, ...]) -> str:
        parts = [c.ljust(w) if flush else c.rjust(w) for c, w, flush in zip(cells, widths, left)]
        return "  ".join(parts).rstrip()

    out = [line(_HEAD), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in rows]
    out.append("")
    out.append("Total memory: what torch.cuda.get_device_properties(0).total_memory reports. Sources:")
    out += [f"  {spec.name}: {spec.source}" for spec in specs]
    out.append(
        "CUDA context and cuBLAS/cuDNN: memory the process holds outside PyTorch's allocator; the "
        "simulated allocator\nmay reserve the capacity, total less both. Sources:"
    )
    out += [f"  {spec.name}: {spec.context_source or 'assumed'}" for spec in specs]
    out.append(
        "A probe result saved on this machine (gpu-mem-track probe) replaces them for its GPU under "
        "run --simulate.\nAny other GPU: --simulate SIZE:smXY (e.g. 24GiB:sm86)."
    )
    return "\n".join(out) + "\n"


def gpus_dict(specs: Iterable[GpuSpec]) -> dict[str, Any]:
    """``{"gpus": [GpuSpec.to_dict() + non_pytorch_bytes + capacity, ...]}`` for ``--json``."""
    return {
        "gpus": [
            {**spec.to_dict(), "non_pytorch_bytes": spec.non_pytorch_bytes, "capacity": spec.capacity}
            for spec in specs
        ]
    }
