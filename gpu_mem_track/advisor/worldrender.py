"""``fit --nproc-per-node``'s answer as text: the GPU and ranks, one table (a row per
trial: the script as it is, each distributed lever that applied, the world size found),
each row's figures the worst rank's; the world sizes tried, the answer in one sentence,
the command and lines to write, the levers that did not apply and why, and what is not
modelled. A string; nothing here prints or runs anything.

The pieces (``heading``, ``world_cells``, ``verdict_lines``, ``NOT_MODELLED``,
``trials_line``) are the HTML page's too (``worldpage``), so the two
say the same thing.
"""

from __future__ import annotations

from ..units import format_bytes
from .distributed import DistributedFit
from .render import batch_text, margin_text, short_line

__all__ = [
    "NOT_MODELLED",
    "heading",
    "render_distributed",
    "trials_line",
    "verdict_lines",
    "world_cells",
]

#: What the figures leave out, under every answer.
NOT_MODELLED = "NCCL's own memory (outside the caching allocator), data that differs per rank"


def world_cells(result: DistributedFit) -> tuple[list[str], list[list[str]]]:
    """The table's header and one row of cells per ``result.rows`` (same order)."""
    header = ["change", "ranks", "worst rank", "peak allocated", "peak reserved", "fits", "headroom", "line"]
    if result.batch_arg is not None:
        header.append("batch/GPU")
    header.append("communication")
    body = []
    for item in result.rows:
        row = item.row
        cells = [
            row.label,
            str(item.world),
            "-" if item.rank is None else str(item.rank),
            format_bytes(row.peak) if row.peak is not None else "-",
            format_bytes(row.reserved_peak) if row.reserved_peak is not None else "-",
            row.fits,
            margin_text(row, result.capacity),
            short_line(row.line) or "-",
        ]
        if result.batch_arg is not None:
            cells.append(batch_text(row))
        cells.append(row.cost or "-")
        body.append(cells)
    return header, body


def heading(result: DistributedFit) -> str:
    """The first line: the script, the ranks and GPU, the capacity, whose figures."""
    text = (
        f"{result.script} on {result.nproc} x {result.gpu} (simulated; {format_bytes(result.capacity)} "
        f"per GPU for PyTorch), figures per GPU: the worst of the ranks simulated (rank 0 and the last)"
    )
    if result.batch is not None:
        text += f"; batch {result.batch} per GPU ({result.batch_arg})"
    return text


def verdict_lines(result: DistributedFit) -> list[str]:
    """The world sizes tried (when a search ran; one that failed for a reason other than
    memory with that reason), then the answer in one sentence."""
    lines = []
    if result.worlds:
        why = dict(result.world_failures)
        tried = ", ".join(f"{w}: {fits}" + (f" ({why[w]})" if w in why else "") for w, fits in result.worlds)
        lines.append(
            f"World sizes tried with {' + '.join(result.sharding) or 'the script as it is'}: {tried}"
        )
    return [*lines, f"Answer: {result.answer}"]


def trials_line(result: DistributedFit) -> str:
    """How many trials, how long, where their run folders are."""
    trials = "1 trial" if result.trials == 1 else f"{result.trials} trials"
    return f"{trials} in {result.seconds:.1f} s; run folders in {result.folder}"


def render_distributed(result: DistributedFit) -> str:
    """The text answer (see the module doc)."""
    header, body = world_cells(result)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = [heading(result)]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in [header, *body]
    ]
    lines += verdict_lines(result)
    if result.launch:
        lines.append("Launch and lines to write:")
        lines += [f"  {line}" for line in result.launch]
    lines += [f"Not tried: {name}: {why}" for name, why in result.not_applied]
    lines.append(f"Not modelled: {NOT_MODELLED}")
    lines.append(trials_line(result))
    return "\n".join(lines) + "\n"
