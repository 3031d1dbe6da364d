"""The advisor's answer as one self-contained HTML page: the GPU and its capacity, the
answer (the recommendation first), the table a user reads first and the details (the
text's, in the same order; the recommended row in bold), the levers not tried and why. The house style sheet
(``html/report.css``) is inlined; the page has no script and fetches nothing.
``render_fit_page`` returns the text; ``write_fit_page`` writes it. The frame is
``pageframe``'s, shared with ``fit --nproc-per-node``'s page (``worldpage``).
"""

from __future__ import annotations

import html
from pathlib import Path, PurePath

from ..units import format_bytes
from .pageframe import html_document, html_list, html_table, write_page
from .records import FitResult
from .render import ordered_rows, summary_cells, table_cells, verdict_lines

__all__ = ["render_fit_page", "write_fit_page"]


def render_fit_page(result: FitResult) -> str:
    """The page's text for ``result``."""
    marks = [row.label == result.recommended for row in ordered_rows(result)]
    answer = "".join(f"<p>{html.escape(line)}</p>" for line in verdict_lines(result))
    sections = [
        f"<section><h2>Answer</h2>{answer}</section>",
        f"<section><h2>Trials</h2>{html_table(*summary_cells(result), marks)}"
        f"<h3>Details</h3>{html_table(*table_cells(result), marks)}"
        f"<p class='note'>{result.trials} simulated trial(s) in {result.seconds:.1f} s; run folders under "
        f"{html.escape(result.folder)}/</p></section>",
    ]
    if result.not_applied:
        sections.append(f"<section><h2>Not tried</h2>{html_list(list(result.not_applied))}</section>")
    if result.compiled:
        sections.append(f"<section><h2>Note</h2><p>{html.escape(result.compiled)}</p></section>")
    subtitle = (
        f"simulated {result.gpu}: capacity {format_bytes(result.capacity)} of "
        f"{format_bytes(result.total_memory)}; a run above {result.threshold:.0%} of the capacity counts as "
        "tight; every row is a simulated run"
    )
    return html_document(
        f"gpu_mem_track fit: {PurePath(result.script).name} on {result.gpu}", subtitle, sections
    )


def write_fit_page(result: FitResult, out: str | Path) -> Path:
    """Write the page for ``result`` to ``out``; returns the path. ``UsageError`` when it
    cannot be written."""
    return write_page(render_fit_page(result), out)
