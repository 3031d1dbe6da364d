"""The advisor's answer as text: a header naming the GPU and its capacity, the answer
(what to do first: the recommendation, or when nothing fits at the user's batch the best
change and the batch it reaches), the table a user reads first (a row per trial of the
script as it is, each lever alone, each combination tried; best first: the change, fits,
largest batch, headroom, cost), the details (peaks, line, change to make), the levers
not tried and why, and where the trials' run folders are. A string; nothing here prints or runs anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

from ..units import format_bytes
from .records import BatchAnswer, FitResult, FitRow

__all__ = [
    "bound_lines",
    "margin_text",
    "ordered_rows",
    "placed",
    "render_fit",
    "short_line",
    "summary_cells",
    "table_cells",
    "verdict_lines",
]


def short_line(line: str) -> str:
    """``"/a/b/model.py:12"`` as ``"model.py:12"`` (a failure's words unchanged)."""
    path, sep, number = line.rpartition(":")
    if not sep or not number.isdigit():
        return line
    return f"{PurePath(path).name}:{number}"


def placed(row: FitRow) -> str:
    """``row``'s change, each lever's part followed by where it goes (``"... (at
    model.py:45)"``) where that is known."""
    if not row.edits:
        return row.change
    return "; ".join(f"{change} (at {short_line(where)})" if where else change for change, where in row.edits)


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
    if row.batch.flat_from is not None:
        return "any"
    return str(row.batch.batch) if row.batch.batch else "none"


def flat_text(answer: BatchAnswer) -> str:
    """Why a batch search found no limit (``BatchAnswer.flat_from``), in words."""
    return (
        f"the same peak at batch {answer.flat_from} and {answer.batch}: no step takes more than "
        f"{answer.flat_from} samples, as with a dataset that small or a batch argument that does "
        "not set the batch"
    )


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


#: How good a row's ``fits`` is, for the order of the table: higher first.
_GOOD = {"yes": 3, "tight": 2, "no": 1, "failed": 0}


def ordered_rows(result: FitResult) -> list[FitRow]:
    """The rows by what they give: those that fit at the user's batch first (within the
    threshold, then tight), then the largest batch that fits (with a batch argument),
    then the cheapest (``plan.rank``)."""
    from .plan import rank

    def key(row: FitRow) -> tuple[int, int, tuple[int, int]]:
        batch = row.batch.batch if row.batch is not None else 0
        return (-_GOOD.get(row.fits, 0), -batch, rank(row.levers))

    return sorted(result.rows, key=key)


def _name(row: FitRow, result: FitResult) -> str:
    return f"{row.label} (recommended)" if row.label == result.recommended else row.label


def summary_cells(result: FitResult) -> tuple[list[str], list[list[str]]]:
    """The table a user reads first, one line per row in ``ordered_rows``' order: the
    change, whether it fits at the user's batch, the largest batch that fits (with a
    batch argument), the headroom (or shortfall) at the user's batch, the cost."""
    at = f" at {result.batch}" if result.batch is not None else ""
    header = ["change", f"fits{at}"]
    if result.batch_arg is not None:
        header.append("largest batch")
    header += [f"headroom{at}", "cost"]
    body = []
    for row in ordered_rows(result):
        cells = [_name(row, result), row.fits]
        if result.batch_arg is not None:
            cells.append(batch_text(row))
        cells += [margin_text(row, result.capacity), cost_text(row)]
        body.append(cells)
    return header, body


def table_cells(result: FitResult) -> tuple[list[str], list[list[str]]]:
    """The details of each row (same order): peak allocated and reserved at the user's
    batch, the line of the peak (or of the out-of-memory), the change to make."""
    header = ["change", "peak allocated", "peak reserved", "line", "to make it"]
    body = []
    for row in ordered_rows(result):
        body.append(
            [
                _name(row, result),
                format_bytes(row.peak) if row.peak is not None else "-",
                format_bytes(row.reserved_peak) if row.reserved_peak is not None else "-",
                short_line(row.line) or "-",
                row.change or "-",
            ]
        )
    return header, body


def table_lines(result: FitResult) -> list[str]:
    """The first table, then the details, one line per row under each header."""
    return [*_table(*summary_cells(result)), "Details:", *_table(*table_cells(result))]


def verdict_lines(result: FitResult) -> list[str]:
    """The answer in words: fits as it is, the recommended change, the best change at a
    smaller batch, or that nothing fits."""
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
            f"Recommended: {row.label} (cheapest change that fits{tight}): {placed(row) or 'see the table'}"
        ]
        if row.changes_results:
            lines.append(f"Note: {row.label} changes the script's results ({cost_text(row)}).")
        return lines + _batch_line(row, result, f"with {row.label}")
    if result.verdict == "smaller" and result.recommended is not None:
        return _smaller_lines(result, result.row(result.recommended))
    at = f" at any batch tried ({_where(result)})" if result.batch_arg is not None else ""
    lines = [
        f"Nothing tried fits{at}: no lever alone, and no combination tried, completed within the capacity."
    ]
    return lines + _batch_line(first, result, "as it is")


def _where(result: FitResult) -> str:
    """The batch argument in words: ``--batch_size``, or ``argument 0 after the script``."""
    arg = result.batch_arg or ""
    return f"argument {arg} after the script" if arg.isdigit() else arg


def _smaller_lines(result: FitResult, row: FitRow) -> list[str]:
    """Nothing fits at the user's batch: the best change and the batch it reaches first."""
    best = row.batch.batch if row.batch is not None else 0
    what = "no change, a smaller batch" if not row.levers else row.label
    lines = [
        f"Nothing fits at batch {result.batch} ({_where(result)}). Best: {what}, which fits batch {best} "
        "(the largest batch of any row; on a tie the cheapest)."
    ]
    if row.levers:
        lines.append(f"  To make it: {row.change or 'see the table'}; and run batch {best}.")
        lines.append(f"  Cost: {cost_text(row)}.")
    else:
        lines.append(f"  To make it: run batch {best}.")
    keep = result.accumulation
    if keep is not None:
        samples = keep.batch * keep.steps
        more = f", {samples} samples" if samples != result.batch else ""
        lines.append(
            f"  To keep the effective batch of {result.batch}: batch {keep.batch} x {keep.steps} "
            f"accumulation steps{more} ({keep.how})."
        )
    lines.append("  The other rows follow, best first.")
    return lines


def _batch_line(row: FitRow, result: FitResult, with_what: str) -> list[str]:
    if row.batch is None:
        return []
    if row.batch.batch == 0:
        return [f"{with_what.capitalize()}, no batch tried fits ({_where(result)})."]
    if row.batch.flat_from is not None:
        where = f"{_where(result)}; you run {result.batch}"
        return [f"{with_what.capitalize()}, any batch fits ({where}): {flat_text(row.batch)}."]
    sentence = f"{with_what.capitalize()}, batch {row.batch.batch} fits"
    return [f"{sentence} ({_where(result)}; you run {result.batch})."]


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
        *verdict_lines(result),
        *table_lines(result),
    ]
    for name, reason in result.not_applied:
        lines.append(f"Not tried: {name}: {reason}")
    if result.compiled:
        lines.append(f"Note: {result.compiled}")
    lines.extend(bound_lines(result))
    lines.append(
        f"{result.trials} simulated trial(s) in {result.seconds:.1f} s; run folders under {result.folder}/"
    )
    return "\n".join(lines) + "\n"
