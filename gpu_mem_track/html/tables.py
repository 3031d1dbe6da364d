"""Small HTML tables for Jupyter's rich display (``_repr_html_``) of the records a user
sees: a ``Stamp``, a loaded ``Run``, a ``Comparison``, an ``Estimate``, and the
notebook magics' results.

Each function takes a record and returns an HTML fragment (a ``<div>`` holding a caption
and a table); nothing here measures, prints or imports torch. Every text that comes from
the records (file names, labels, code, tensor names) is escaped. Sizes are the records'
bytes, shown with ``units.format_bytes``.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from typing import Any

from ..units import format_bytes, format_peak, shape_text

__all__ = [
    "cell_html",
    "changes_html",
    "comparison_html",
    "estimate_html",
    "line_table_html",
    "run_html",
    "stamp_html",
    "statement_html",
    "table",
]

#: Group changes and rows shown before "... n more".
MAX_ROWS = 12

_STYLE = "font-family:monospace;font-size:12px;border-collapse:collapse"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "", right: int = 1) -> str:
    """An HTML table: ``headers``, then ``rows`` (cells already text, escaped here); columns
    from index ``right`` on are right-aligned (numbers)."""
    head = "".join(f"<th style='text-align:{_align(i, right)}'>{_esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(f"<td style='text-align:{_align(i, right)}'>{_esc(c)}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    title = f"<caption style='text-align:left;font-weight:bold'>{_esc(caption)}</caption>" if caption else ""
    return f"<table style='{_STYLE}'>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def stamp_html(stamp: Any) -> str:
    """A ``tracker.records.Stamp`` compactly: where, the ledger's figures on one row, and
    the largest group changes (at most ``MAX_ROWS``)."""
    ledger = stamp.ledger
    where = f"{os.path.basename(stamp.file)}:{stamp.line} {stamp.function}"
    caption = f"#{stamp.seq} {where}" + (f" [{stamp.label}]" if stamp.label else "")
    if ledger.device.startswith("cuda"):
        figures = {
            "tensors": ledger.tensors,
            "allocated": ledger.allocated,
            "reserved": ledger.reserved,
            "driver": ledger.driver,
        }
    else:
        figures = {"tensors": ledger.tensors, "process RSS": ledger.rss}
    totals = table(["device", *figures], [[ledger.device, *map(format_bytes, figures.values())]], caption)
    return f"<div>{totals}{changes_html(stamp.changes)}</div>"


def changes_html(changes: Sequence[Any], caption: str = "tensor groups created or freed") -> str:
    """``tracker.records.GroupChange`` rows, largest first (``""`` when there are none)."""
    if not changes:
        return ""
    rows = [
        [
            format_bytes(c.bytes_delta, signed=True),
            f"{c.count_delta:+d}",
            c.kind,
            shape_text(c.shape),
            c.dtype.replace("torch.", ""),
            _names(c.names),
        ]
        for c in changes[:MAX_ROWS]
    ]
    if len(changes) > MAX_ROWS:
        rows.append([f"... {len(changes) - MAX_ROWS} more", "", "", "", "", ""])
    return table(["bytes", "count", "kind", "shape", "dtype", "names"], rows, caption, right=0)


def line_table_html(records: Sequence[Any], caption: str = "", strip: str = "") -> str:
    """``runfolder.records.LineRecord`` rows in file and line order: line, code, hits, memory
    after, increment, peak (``>=`` for a lower bound). ``strip``: a file name to leave out
    of the line column (a notebook cell's pseudo-file)."""
    rows = []
    for r in sorted(records, key=lambda r: (r.file, r.line)):
        where = f"{os.path.basename(r.file)}:{r.line}"
        if r.file == strip:  # a notebook cell: its line, and the function unless the cell's own
            where = str(r.line) if r.function == "<module>" else f"{r.line} ({r.function})"
        rows.append(
            [
                where,
                r.code,
                str(r.hits),
                format_bytes(r.memory),
                format_bytes(r.increment, signed=True),
                format_peak(r.peak, r.peak_exact),
            ]
        )
    return table(["line", "code", "hits", "memory", "increment", "peak"], rows, caption, right=2)


def run_html(run: Any) -> str:
    """A ``runs.load.Run``: name, kind, device, memory source and peak, then its hottest
    lines (largest total increment) or its ``track()`` labels."""
    summary = table(
        ["run", "kind", "device", "memory", "peak", "events"],
        [
            [
                run.name,
                run.kind,
                run.device or "?",
                run.memory_source or "?",
                format_bytes(run.peak),
                str(run.events),
            ]
        ],
        right=4,
    )
    detail = ""
    if run.lines:
        hottest = sorted(run.lines, key=lambda r: (-r.increment, -r.peak))[:MAX_ROWS]
        detail = line_table_html(hottest, "largest increments")
    elif run.labels:
        rows = [
            [
                p.label or f"({p.function})",
                f"{os.path.basename(p.file)}:{p.line}",
                f"{p.elapsed:.3f}",
                format_bytes(p.memory),
            ]
            for p in run.labels[:MAX_ROWS]
        ]
        detail = table(["label", "where", "seconds", "memory"], rows, "track() stamps", right=2)
    return f"<div>{summary}{detail}</div>"


def comparison_html(comparison: Any, top: int = 20) -> str:
    """A ``runs.compare.Comparison``: both peaks and their difference, then its first
    ``top`` rows (largest difference first)."""
    a, b = comparison.a, comparison.b
    head = table(
        ["", "run", "peak"],
        [["A", a.name, format_bytes(a.peak)], ["B", b.name, format_bytes(b.peak)]]
        + [["B-A", "", format_bytes(comparison.peak_difference, signed=True)]],
        f"compared by {comparison.by}",
        right=2,
    )
    rows = [
        [
            " ".join(row.key) + (f" #{row.occurrence}" if row.occurrence > 1 else ""),
            _figure(row.a),
            _figure(row.b),
            format_bytes(row.difference, signed=True),
            format_bytes(row.peak_difference, signed=True),
        ]
        for row in comparison.rows[: top or None]
    ]
    value = "memory" if comparison.by == "label" else "increment"
    body = table(["key", f"A {value}", f"B {value}", "B-A", "peak B-A"], rows, right=1)
    return f"<div>{head}{body}</div>"


def estimate_html(estimate: Any) -> str:
    """An ``estimator.records.Estimate``: the totals, the peak with its phase, each phase's
    peak and the parts live at the peak."""
    kind = "training step" if estimate.training else "inference"
    caption = f"Estimated {kind} of {estimate.model} on {estimate.device} ({estimate.dtype})"
    totals = [
        ["parameters", format_bytes(estimate.parameter_bytes)],
        ["buffers", format_bytes(estimate.buffer_bytes)],
        ["gradients", format_bytes(estimate.gradient_bytes)],
        ["optimizer state", format_bytes(estimate.optimizer_state_bytes)],
        ["inputs", format_bytes(estimate.input_bytes)],
        ["activations", format_bytes(estimate.activation_bytes)],
        [f"peak ({estimate.peak_phase.phase})", format_bytes(estimate.peak)],
    ]
    phases = [[p.phase, format_bytes(p.peak), p.op, p.module] for p in estimate.phases]
    at_peak = [[name, format_bytes(value)] for name, value in estimate.at_peak.by_label().items() if value]
    return (
        f"<div>{table(['total', 'bytes'], totals, caption)}"
        f"{table(['phase', 'peak', 'op', 'module'], phases, 'phases', right=1)}"
        f"{table(['live at the peak', 'bytes'], at_peak)}</div>"
    )


def statement_html(result: Any) -> str:
    """A ``notebook.records.StatementMemory``: increment, peak and RSS on one row, then
    the tensor groups the statement created or freed."""
    what = "allocated" if result.source == "cuda allocator" else "tensors"
    row = [
        result.device,
        format_bytes(result.increment, signed=True),
        format_bytes(result.after),
        format_peak(result.peak, result.peak_exact) + f" ({result.peak_source})",
        "n/a"
        if result.rss_after is None
        else format_bytes(result.rss_after - result.rss_before, signed=True),
        f"{result.seconds:.3f}",
    ]
    head = table(
        ["device", what, "after", "peak", "RSS change", "seconds"], [row], f"%memtrack {result.statement}"
    )
    body = changes_html(result.changes) or "<p>no tensor group created or freed</p>"
    return f"<div>{head}{body}</div>"


def cell_html(profile: Any) -> str:
    """A ``notebook.records.CellProfile``: the per-line table, then each census's
    changes."""
    where = f" at line {profile.peak_line}" if profile.peak_line is not None else ""
    caption = f"%%memtrack on {profile.device} ({profile.source}): peak {format_bytes(profile.peak)}{where}"
    simulation = getattr(profile, "simulation", None)
    if simulation is not None:
        caption += f" | simulated {simulation.gpu.get('name', '?')}, no GPU used"
    censuses = "".join(stamp_html(stamp) for stamp in profile.censuses)
    return f"<div>{line_table_html(profile.lines, caption, strip=profile.filename)}{censuses}</div>"


def _figure(figures: Any) -> str:
    return "-" if figures is None else format_bytes(figures.value)


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", +{len(names) - limit}" if len(names) > limit else "")


def _align(index: int, right: int) -> str:
    return "right" if index >= right else "left"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)
