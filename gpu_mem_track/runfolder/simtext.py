"""Text on a simulated run, an early stop and ``run --lever``'s levers, for the run's
report and summary.

Renderers: they take the run's description (``records.RunInfo``) and return strings.
"""

from __future__ import annotations

import os
from typing import Any

from ..probecache import SAVED_PROBE_ENV, SAVED_SOURCE
from ..units import format_bytes
from .records import RunInfo, SimulationInfo

__all__ = ["compiled_note", "levers_line", "simulation_lines", "simulation_report"]

#: Placeholder reads and bounds listed in the report (the rest counted).
_LISTED = 20


def simulation_lines(info: RunInfo) -> list[str]:
    """The few lines the summary and the report's header add: the GPU, where it would run
    out of memory, where the run was stopped early and the levers it ran with."""
    out = []
    sim = info.simulation
    if sim is not None:
        out.append(f"Simulated GPU: {_gpu(sim.gpu)} (no GPU was used; memory is the allocator model's)")
        if info.reserved_peak is not None:
            out.append(f"Peak reserved: {format_bytes(info.reserved_peak)} ({info.reserved_peak:,} B)")
        if sim.out_of_memory is not None:
            out.append(_oom(sim.out_of_memory, info.exit_code))
        if sim.compiled:
            out.append(compiled_note(sim))
    if info.stopped is not None:
        text = _short_where(info.stopped.describe())
        out.append(text[0].upper() + text[1:])
    if info.levers:
        out.append(levers_line(info.levers))
    return out


def levers_line(levers: Any) -> str:
    """One line: the ``run --lever`` levers applied, with what each did, then those not
    applied, with why (``RunInfo.levers``' dicts)."""
    applied = [f"{lv['name']} ({lv.get('detail') or 'applied'})" for lv in levers if lv.get("applied")]
    skipped = [
        f"{lv['name']} ({lv.get('reason') or 'why not unknown'})" for lv in levers if not lv.get("applied")
    ]
    text = f"Levers applied: {', '.join(applied) or 'none'}"
    return text + (f"; not applied: {', '.join(skipped)}" if skipped else "")


def compiled_note(sim: SimulationInfo) -> str:
    """One line on the torch.compile regions of a simulated run (``sim.compiled``; empty
    string without any): where each was compiled and that it was simulated as eager code,
    so the peak may differ from a GPU's (``simgpu.compiled`` says why)."""
    if not sim.compiled:
        return ""
    sites = [_compiled_site(r) for r in sim.compiled[:_LISTED]]
    if len(sim.compiled) > _LISTED:
        sites.append(f"and {len(sim.compiled) - _LISTED} more")
    regions = sum(int(r["count"]) for r in sim.compiled)
    inductor = any(r["backend"] == "inductor" for r in sim.compiled)
    who = "Inductor's saved tensors and buffers are" if inductor else "the compiler's saved tensors are"
    text = (
        f"{'; '.join(sites)}: {regions} compiled region{'s' * (regions != 1)} simulated as eager; "
        f"{who} not modelled, so the peak may differ"
    )
    if any(r["mode"] in _CUDA_GRAPH_MODES for r in sim.compiled):
        text += "; CUDA graphs' private memory pool is not modelled either"
    return text


#: torch.compile modes that capture CUDA graphs (``torch._inductor.list_mode_options``).
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def _compiled_site(record: dict[str, Any]) -> str:
    settings = [] if record["backend"] == "inductor" else [f"backend={record['backend']!r}"]
    if record["mode"] not in ("", "default"):
        settings.append(f"mode={record['mode']!r}")
    call = f"{record['api']}({', '.join(settings)})" if settings else str(record["api"])
    count = int(record["count"])
    return f"{call} at {_where(record)}" + (f" (x{count})" if count != 1 else "")


def simulation_report(sim: SimulationInfo) -> str:
    """The report's section on what the simulation could not know: value reads that got a
    placeholder, data-dependent shapes taken at a bound, saves that wrote nothing, regions
    torch.compile would have compiled."""
    out = ["Simulation: what could not be known without the GPU", "=" * 51]
    if sim.compiled:
        out.append(compiled_note(sim) + ".")
    if sim.placeholders:
        out.append(
            "Values read from simulated tensors got a placeholder (0, False): control flow that depends"
            "\non them may have gone another way on the GPU."
        )
        out += [_read(r) for r in sim.placeholders[:_LISTED]]
        out += _more(len(sim.placeholders))
    if sim.bounds:
        out.append("Data-dependent shapes taken at their upper bound (every element selected):")
        out += [
            f"  {_where(r)}  {r['op']}  bound {r['bound']:,}  x{r['count']}" for r in sim.bounds[:_LISTED]
        ]
        out += _more(len(sim.bounds))
    if sim.skipped_saves:
        out.append(f"torch.save of simulated tensors wrote nothing ({sim.skipped_saves} call(s)).")
    if len(out) == 2:
        out.append(
            "(nothing: every value read was known, no shape depended on data, nothing was saved, "
            "nothing was compiled)"
        )
    return "\n".join(out) + "\n"


def _gpu(gpu: dict[str, Any]) -> str:
    major, minor = gpu.get("capability", (0, 0))
    workspace = format_bytes(int(gpu.get("cublas_workspace", 0)))
    return (
        f"{gpu.get('name', '?')}, {format_bytes(int(gpu.get('total_memory', 0)))} ({_outside(gpu)}), "
        f"compute capability {major}.{minor}, cuBLAS workspace {workspace}"
    )


def _outside(gpu: dict[str, Any]) -> str:
    """The non-PyTorch memory the simulation counted (CUDA context, cuBLAS/cuDNN handles),
    and whether it was measured, and by a probe saved on this machine (a description
    written before libraries were counted holds an assumed context only)."""
    context, libraries = int(gpu.get("context_bytes", 0)), gpu.get("library_bytes", 0)
    libraries = libraries if isinstance(libraries, int) and not isinstance(libraries, bool) else 0
    source = str(gpu.get("context_source", ""))
    measured = "measured" if source.startswith("measured") else "assumed"
    if source.startswith(SAVED_SOURCE):
        measured += f" by this machine's saved probe, {SAVED_PROBE_ENV}=off ignores it"
    text = f"non-PyTorch memory {format_bytes(context + libraries)} {measured}"
    if libraries:
        text += f": CUDA context {format_bytes(context)}, cuBLAS/cuDNN {format_bytes(libraries)}"
    return text


def _oom(oom: dict[str, Any], exit_code: int | None) -> str:
    fate = "the script caught it and went on" if exit_code == 0 else "uncaught"
    return (
        f"Would run out of memory at {_where(oom)}: {format_bytes(oom['request'])} requested with "
        f"{format_bytes(oom['allocated'])} allocated and {format_bytes(oom['reserved'])} reserved of "
        f"{format_bytes(oom['capacity'])} ({fate})"
    )


def _read(record: dict[str, Any]) -> str:
    return f"  {_where(record)}  {record['op']}  x{record['count']}"


def _more(count: int) -> list[str]:
    return [f"  ... and {count - _LISTED} more"] if count > _LISTED else []


def _where(record: dict[str, Any]) -> str:
    return f"{short_path(str(record['filename']))}:{record['line']}"


def _short_where(text: str) -> str:
    """``text`` with the working folder's prefix taken off its paths."""
    cwd = os.getcwd() + os.sep
    return text.replace(cwd, "")


def short_path(path: str) -> str:
    """``path`` relative to the working folder when it is inside it, else as given."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative
