"""The advisor's answer as one self-contained HTML page: the GPU and its capacity, the
answer (the recommendation first), the table a user reads first and the details (the
text's, in the same order; the recommended row in bold), the levers not tried and why. The house style sheet
(``html/report.css``) is inlined; the page has no script and fetches nothing.
``render_fit_page`` returns the text; ``write_fit_page`` writes it.
"""

from __future__ import annotations

import html
from pathlib import Path, PurePath

from ..errors import UsageError
from ..units import format_bytes
from .records import FitResult
from .render import ordered_rows, summary_cells, table_cells, verdict_lines

__all__ = ["render_fit_page", "write_fit_page"]

_CSS = Path(__file__).resolve().parent.parent / "html" / "report.css"
_NUMERIC = ("peak allocated", "peak reserved", "headroom", "largest batch")
#: The recommended row stands out (the house style sheet has no rule for it).
_STYLE = "tr.recommended td { font-weight: bold; }\n"


def _cells(values: list[str], header: list[str], tag: str, recommended: bool = False) -> str:
    out = []
    for name, value in zip(header, values):
        numeric = name.startswith(_NUMERIC)
        klass = " class='num'" if numeric else (" class='code'" if name == "to make it" else "")
        out.append(f"<{tag}{klass}>{html.escape(value)}</{tag}>")
    return ("<tr class='recommended'>" if recommended else "<tr>") + "".join(out) + "</tr>"


def _table(result: FitResult, header: list[str], body: list[list[str]]) -> str:
    marks = [row.label == result.recommended for row in ordered_rows(result)]
    rows = "".join(_cells(values, header, "td", mark) for values, mark in zip(body, marks))
    return f"<table class='fit'><thead>{_cells(header, header, 'th')}</thead><tbody>{rows}</tbody></table>"


def render_fit_page(result: FitResult) -> str:
    """The page's text for ``result``."""
    title = html.escape(f"gpu_mem_track fit: {PurePath(result.script).name} on {result.gpu}")
    answer = "".join(f"<p>{html.escape(line)}</p>" for line in verdict_lines(result))
    skipped = "".join(
        f"<li><b>{html.escape(name)}</b>: {html.escape(reason)}</li>" for name, reason in result.not_applied
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{title}</title>\n<style>\n{_CSS.read_text(encoding='utf-8')}{_STYLE}</style>\n</head>\n"
        "<body>\n"
        f"<header><h1>{title}</h1><p>simulated {html.escape(result.gpu)}: capacity "
        f"{format_bytes(result.capacity)} of {format_bytes(result.total_memory)}; a run above "
        f"{result.threshold:.0%} of the capacity counts as tight; every row is a simulated run</p></header>\n"
        f"<main>\n<section><h2>Answer</h2>{answer}</section>\n"
        f"<section><h2>Trials</h2>{_table(result, *summary_cells(result))}"
        f"<h3>Details</h3>{_table(result, *table_cells(result))}"
        f"<p class='note'>{result.trials} simulated trial(s) in {result.seconds:.1f} s; run folders under "
        f"{html.escape(result.folder)}/</p></section>\n"
        + (f"<section><h2>Not tried</h2><ul>{skipped}</ul></section>\n" if skipped else "")
        + "</main>\n</body>\n</html>\n"
    )


def write_fit_page(result: FitResult, out: str | Path) -> Path:
    """Write the page for ``result`` to ``out``; returns the path. ``UsageError`` when it
    cannot be written."""
    target = Path(out)
    try:
        target.write_text(render_fit_page(result), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target
