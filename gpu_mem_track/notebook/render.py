"""The notebook magics' results as text (a terminal IPython, ``print``).

The records call these lazily (their ``_repr_pretty_``), so, as ``html.tables`` does for
their HTML, the functions take them as they come and import none of them."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ..runfolder.records import SimulationInfo, hottest
from ..tracker.render import render_stamp
from ..units import format_bytes, format_peak, shape_text

__all__ = ["render_cell", "render_statement", "simulation_text"]


def render_statement(result: Any) -> str:
    """A ``notebook.records.StatementMemory``: the statement's increment, peak, RSS and
    the groups it created or freed."""
    what = "allocated" if result.source == "cuda allocator" else "tensors"
    peak_rise = format_bytes(result.peak - result.peak_before, signed=True)
    lines = [
        f"%memtrack on {result.device}: {what} {format_bytes(result.increment, signed=True)} "
        f"({format_bytes(result.before)} -> {format_bytes(result.after)}) | peak "
        f"{format_peak(result.peak, result.peak_exact)} {result.peak_source} ({peak_rise} over before) "
        f"| {result.seconds:.3f} s"
    ]
    if result.rss_before is not None and result.rss_after is not None:
        lines.append(
            f"  process RSS {format_bytes(result.rss_after - result.rss_before, signed=True)} "
            f"({format_bytes(result.rss_before)} -> {format_bytes(result.rss_after)})"
        )
    for change in result.changes:
        names = f"  {', '.join(change.names)}" if change.names else ""
        lines.append(
            f"  {format_bytes(change.bytes_delta, signed=True):>12} {change.count_delta:+d} "
            f"{change.kind} {shape_text(change.shape)} {change.dtype.replace('torch.', '')}{names}"
        )
    if not result.changes:
        lines.append("  no tensor group created or freed")
    return "\n".join(lines) + "\n"


def render_cell(profile: Any) -> str:
    """A ``notebook.records.CellProfile``: the cell's per-line table (line order), its top
    lines and its censuses."""
    rows = [
        [
            _where(r.line, r.function),
            r.hits,
            format_bytes(r.memory),
            format_bytes(r.increment, signed=True),
            format_peak(r.peak, r.peak_exact),
            r.code,
        ]
        for r in sorted(profile.lines, key=lambda r: (r.file, r.line))
    ]
    head = (
        f"%%memtrack on {profile.device} ({profile.source}): peak {format_bytes(profile.peak)}"
        + (f" at line {profile.peak_line}" if profile.peak_line is not None else "")
        + f" | {profile.seconds:.3f} s"
    )
    table = tabulate(
        rows,
        ["line", "hits", "memory", "increment", "peak", "code"],
        tablefmt="simple",
        disable_numparse=True,
    )
    out = [head]
    if profile.simulation is not None:
        out.append(simulation_text(profile.simulation))
    out.append(table)
    top = hottest(list(profile.lines), profile.top)
    if top:
        out.append(
            "Largest increments: "
            + ", ".join(f"line {r.line} {format_bytes(r.increment, signed=True)}" for r in top)
        )
    out.extend(render_stamp(stamp).rstrip("\n") for stamp in profile.censuses)
    return "\n".join(out) + "\n"


def simulation_text(sim: SimulationInfo) -> str:
    """One line on the simulated GPU a cell ran on: its name, value reads that got a
    placeholder, where it would run out of memory."""
    gpu = sim.gpu
    text = f"simulated {gpu.get('name', '?')} ({format_bytes(int(gpu.get('total_memory', 0)))}; no GPU used)"
    reads = sum(int(r.get("count", 1)) for r in sim.placeholders)
    if reads:
        text += f" | {reads} value read(s) got a placeholder"
    oom = sim.out_of_memory
    if oom is not None:
        text += f" | would run out of memory at line {oom['line']} ({format_bytes(oom['request'])} requested)"
    return text


def _where(line: int, function: str) -> str:
    """A cell line, with its function when it is not the cell's own code."""
    return str(line) if function == "<module>" else f"{line} ({function})"
