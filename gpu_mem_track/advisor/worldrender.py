"""``fit --nproc-per-node``'s answer as text: the GPU and ranks, one table (a row per
trial: the script as it is, each distributed lever that applied, the world size found),
each row's figures the worst rank's; the world sizes tried, the answer in one sentence,
the command and lines to write, the levers that did not apply and why, and what is not
modelled. A string; nothing here prints or runs anything.
"""

from __future__ import annotations

from ..units import format_bytes
from .distributed import DistributedFit
from .render import batch_text, margin_text, short_line

__all__ = ["render_distributed"]


def _cells(result: DistributedFit) -> tuple[list[str], list[list[str]]]:
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


def render_distributed(result: DistributedFit) -> str:
    """The text answer (see the module doc)."""
    lines = [
        f"{result.script} on {result.nproc} x {result.gpu} (simulated; {format_bytes(result.capacity)} "
        f"per GPU for PyTorch), figures per GPU: the worst of the ranks simulated (rank 0 and the last)",
    ]
    if result.batch is not None:
        lines[0] += f"; batch {result.batch} per GPU ({result.batch_arg})"
    header, body = _cells(result)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in [header, *body]
    ]
    if result.worlds:
        tried = ", ".join(f"{w}: {fits}" for w, fits in result.worlds)
        lines.append(
            f"World sizes tried with {' + '.join(result.sharding) or 'the script as it is'}: {tried}"
        )
    lines.append(f"Answer: {result.answer}")
    if result.launch:
        lines.append("Launch and lines to write:")
        lines += [f"  {line}" for line in result.launch]
    for name, why in result.not_applied:
        lines.append(f"Not tried: {name}: {why}")
    lines.append(
        "Not modelled: NCCL's own memory (outside the caching allocator), data that differs per rank"
    )
    lines.append(f"{result.trials} trials in {result.seconds:.1f} s; run folders in {result.folder}")
    return "\n".join(lines) + "\n"
