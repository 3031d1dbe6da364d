"""The advisor's answer as one self-contained HTML page: the GPU and its capacity, the
answer (the recommendation first), the table a user reads first and the details (the
text's, in the same order; the recommended row in bold), the levers not tried and why. The house style sheet
(``html/report.css``) is inlined; the page has no script and fetches nothing.
``render_fit_page`` returns the text; ``write_fit_page`` writes it. The frame
(``html_document``, ``html_table``, ``html_list``, ``write_page``) is also
``fit --nproc-per-node``'s page's (``worldpage``).
"""

from __future__ import annotations

import html
from pathlib import Path, PurePath

from ..errors import UsageError
from ..units import format_bytes
from .records import FitResult
from .render import ordered_rows, summary_cells, table_cells, verdict_lines

__all__ = ["html_document", "html_list", "html_table", "render_fit_page", "write_fit_page", "write_page"]

_CSS = Path(__file__).resolve().parent.parent / "html" / "report.css"
_NUMERIC = (
    "peak allocated",
    "peak reserved",
    "headroom",
    "largest batch",
    "ranks",
    "worst rank",
    "batch/GPU",
)
#: The recommended row stands out (the house style sheet has no rule for it).
_STYLE = "tr.recommended td { font-weight: bold; }\n"


def _cells(values: list[str], header: list[str], tag: str, recommended: bool = False) -> str:
    out = []
    for name, value in zip(header, values):
        numeric = name.startswith(_NUMERIC)
        klass = " class='num'" if numeric else (" class='code'" if name == "to make it" else "")
        out.append(f"<{tag}{klass}>{html.escape(value)}</{tag}>")
    return ("<tr class='recommended'>" if recommended else "<tr>") + "".join(out) + "</tr>"


def html_table(header: list[str], body: list[list[str]], marked: list[bool]) -> str:
    """A table of escaped cells; the rows where ``marked`` is true in bold."""
    rows = "".join(_cells(values, header, "td", mark) for values, mark in zip(body, marked))
    return f"<table class='fit'><thead>{_cells(header, header, 'th')}</thead><tbody>{rows}</tbody></table>"


def html_list(items: list[tuple[str, str]]) -> str:
    """``(name, text)`` pairs as a list, each name in bold, both escaped."""
    rows = "".join(f"<li><b>{html.escape(name)}</b>: {html.escape(text)}</li>" for name, text in items)
    return f"<ul>{rows}</ul>"


def html_document(title: str, subtitle: str, sections: list[str]) -> str:
    """The page: ``title`` and ``subtitle`` (plain text, escaped here) in the header,
    then ``sections`` (HTML, each a ``<section>``), under the inlined style sheet."""
    title = html.escape(title)
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{title}</title>\n<style>\n{_CSS.read_text(encoding='utf-8')}{_STYLE}</style>\n</head>\n"
        f"<body>\n<header><h1>{title}</h1><p>{html.escape(subtitle)}</p></header>\n"
        "<main>\n" + "".join(f"{section}\n" for section in sections) + "</main>\n</body>\n</html>\n"
    )


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


def write_page(text: str, out: str | Path) -> Path:
    """Write the page ``text`` to ``out``; returns the path. ``UsageError`` when it
    cannot be written."""
    target = Path(out)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def write_fit_page(result: FitResult, out: str | Path) -> Path:
    """Write the page for ``result`` to ``out``; returns the path. ``UsageError`` when it
    cannot be written."""
    return write_page(render_fit_page(result), out)
