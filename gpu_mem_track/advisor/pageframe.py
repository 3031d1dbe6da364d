"""The frame of the advisor's HTML pages (``page``: fit's for one GPU; ``worldpage``:
``fit --nproc-per-node``'s): the document with the house style sheet (``html/report.css``)
inlined and a rule that sets the recommended row in bold, its header, a table of escaped
cells (the figures' columns right-aligned), a list of named items, and the writing of a
page. The pages have no script and fetch nothing.
"""

from __future__ import annotations

import html
from pathlib import Path

from ..errors import UsageError

__all__ = ["html_document", "html_list", "html_table", "write_page"]

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


def write_page(text: str, out: str | Path) -> Path:
    """Write the page ``text`` to ``out``; returns the path. ``UsageError`` when it
    cannot be written."""
    target = Path(out)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target
