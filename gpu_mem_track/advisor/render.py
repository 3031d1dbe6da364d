"""The advisor's answer as text: a header naming the GPU and its capacity, one table
(a row per trial of the script as it is, each lever alone, each combination tried),
the recommendation, the levers that did not apply and why, and where the trials' run
folders are. A string; nothing here prints or runs anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

from ..units import format_bytes
from .records import FitResult, FitRow

__all__ = ["bound_lines", "margin_text", "render_fit", "short_line", "table_cells", "verdict_lines"]


def short_line(line: str) -> str:
    """``"/a/b/model.py:12"`` as ``"model.py:12"`` (a failure's words unchanged)."""
    path, sep, number = line.rpartition(":")
    if not sep or not number.isdigit():
        return line
    return f"{PurePath(path).name}:{number}"


def margin_text(row: FitRow, capacity: int) -> str:
    """The headroom (``"6.40 GiB (29%)"``) or the shortfall (``"short >= 1.20 GiB"``)."""
    if row.margin is None:
        return "-"
    if row.margin < 0 or row.at_least:
        return f"short {'>= ' if row.at_least else ''}{format_bytes(-row.margin)}"
    share = 100 * row.margin / capacity if capacity else 0.0
    return f"{format_bytes(row.margin)} ({share:.0f}%)"


def batch_text(row: FitRow) -> str:
    if row.batch is None:
        return "-"
    return str(row.batch.batch) if row.batch.batch else "none"


def cost_text(row: FitRow) -> str:
    text = row.cost or ("none" if row.levers else "-")
    if row.changes_results and "result" not in text:
        text += " (results change)"
    return text


def _table(header: Sequence[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [list(header), *body]) for i in range(len(header))]
    lines = []
    for cells in [list(header), *body]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    return lines


def table_cells(result: FitResult) -> tuple[list[str], list[list[str]]]:
    """The table's header and each row's cells, as text (the text table and the page)."""
    header = ["change", "peak allocated", "peak reserved", "fits", "headroom", "line", "cost"]
    if result.batch_arg is not None:
        header.append("largest batch")
    header.append("to make it")
    body = []
    for row in result.rows:
        cells = [
            row.label,
            format_bytes(row.peak) if row.peak is not None else "-",
            format_bytes(row.reserved_peak) if row.reserved_peak is not None else "-",
            row.fits,
            margin_text(row, result.capacity),
            short_line(row.line) or "-",
            cost_text(row),
        ]
        if result.batch_arg is not None:
            cells.append(batch_text(row))
        cells.append(row.change or "-")
        body.append(cells)
    return header, body


def table_lines(result: FitResult) -> list[str]:
    """The table, one line per row under a header."""
    return _table(*table_cells(result))


def verdict_lines(result: FitResult) -> list[str]:
    """The answer in words: fits as it is, the recommended change, or that nothing fits."""
    first = result.rows[0]
    if result.verdict == "failed":
        return [
            f"The script failed for a reason other than memory ({first.line or 'no result'}); "
            f"no levers tried. See {first.folder}"
        ]
    if result.verdict in ("fits", "tight"):
        where = f"peak at {short_line(first.line)}" if first.line else "peak line unknown"
        head = "It fits as it is" if result.verdict == "fits" else "It fits as it is, but tight"
        lines = [f"{head}: {margin_text(first, result.capacity)} headroom, {where}."]
        if result.verdict == "tight":
            lines.append(
                f"No lever tried brings its peak reserved under {result.threshold:.0%} of the capacity."
            )
        return lines + _batch_line(first, result, "as it is")
    if result.verdict == "found" and result.recommended is not None:
        row = result.row(result.recommended)
        tight = ", but tight" if row.fits == "tight" else ""
        lines = [
            f"Recommended: {row.label} (cheapest change that fits{tight}): {row.change or 'see the table'}"
        ]
        if row.changes_results:
            lines.append(f"Note: {row.label} changes the script's results ({cost_text(row)}).")
        return lines + _batch_line(row, result, f"with {row.label}")
    lines = ["Nothing tried fits: no lever alone, and no combination tried, completed within the capacity."]
    return lines + _batch_line(first, result, "as it is")


def _batch_line(row: FitRow, result: FitResult, with_what: str) -> list[str]:
    if row.batch is None:
        return []
    if row.batch.batch == 0:
        return [f"{with_what.capitalize()}, no batch tried fits ({result.batch_arg})."]
    sentence = f"{with_what.capitalize()}, batch {row.batch.batch} fits"
    return [f"{sentence} ({result.batch_arg}; you run {result.batch})."]


def bound_lines(result: FitResult) -> list[str]:
    """A note naming the rows whose run was stopped by ``--max-iterations`` or
    ``--max-seconds`` rather than left once steady: their figures go up to that point."""
    cut = [row.label for row in result.rows if row.stopped in ("max-iterations", "max-seconds")]
    if not cut:
        return []
    return [f"Note: stopped by --max-iterations or --max-seconds, not once steady: {', '.join(cut)}."]


def render_fit(result: FitResult) -> str:
    """The whole answer as text, ending with a newline."""
    non = result.total_memory - result.capacity
    lines = [
        f"What would fit: {PurePath(result.script).name} on simulated {result.gpu}: capacity "
        f"{format_bytes(result.capacity)} ({format_bytes(result.total_memory)} less "
        f"{format_bytes(non)} non-PyTorch); tight above {result.threshold:.0%} of it",
        *table_lines(result),
        *verdict_lines(result),
    ]
    for name, reason in result.not_applied:
        lines.append(f"Not applied: {name}: {reason}")
    lines.extend(bound_lines(result))
    lines.append(
        f"{result.trials} simulated trial(s) in {result.seconds:.1f} s; run folders under {result.folder}/"
    )
    return "\n".join(lines) + "\n"
