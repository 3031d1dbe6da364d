"""The GPU catalog as a table (``gpu-mem-track gpus``): a renderer, torch-free."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..units import format_bytes
from .catalog import GpuSpec

__all__ = ["gpus_dict", "render_gpus"]

_HEAD = ("GPU", "Device name", "Total memory", "CC", "cuBLAS workspace", "CUDA context", "Capacity")


def render_gpus(specs: Sequence[GpuSpec]) -> str:
    """One row per GPU: name, what ``torch.cuda.get_device_name`` says, total memory as
    torch reports it, compute capability, cuBLAS workspace per handle and stream, the
    CUDA context assumed and the allocator's capacity (total less context); then where
    each memory figure comes from."""
    rows = [
        (
            spec.name,
            spec.device_name,
            format_bytes(spec.total_memory),
            f"{spec.capability[0]}.{spec.capability[1]}",
            format_bytes(spec.cublas_workspace),
            format_bytes(spec.context_bytes),
            format_bytes(spec.capacity),
        )
        for spec in specs
    ]
    widths = [max(len(row[i]) for row in [_HEAD, *rows]) for i in range(len(_HEAD))]
    left = (True, True, False, False, False, False, False)

    def line(cells: tuple[str, ...]) -> str:
        parts = [c.ljust(w) if flush else c.rjust(w) for c, w, flush in zip(cells, widths, left)]
        return "  ".join(parts).rstrip()

    out = [line(_HEAD), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in rows]
    out.append("")
    out.append("Total memory: what torch.cuda.get_device_properties(0).total_memory reports. Sources:")
    out += [f"  {spec.name}: {spec.source}" for spec in specs]
    out.append(
        "CUDA context: an assumption (lazy module loading), not a measurement; the simulated allocator "
        "may reserve\nthe capacity, total less context. Any other GPU: --simulate SIZE:smXY "
        "(e.g. 24GiB:sm86)."
    )
    return "\n".join(out) + "\n"


def gpus_dict(specs: Iterable[GpuSpec]) -> dict[str, Any]:
    """``{"gpus": [GpuSpec.to_dict() + capacity, ...]}`` for ``--json``."""
    return {"gpus": [{**spec.to_dict(), "capacity": spec.capacity} for spec in specs]}
