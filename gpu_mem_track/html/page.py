"""The HTML report as one self-contained page: the data as embedded JSON, the style
sheet and the script inline (``report.css``, ``report.js`` beside this module); the page
fetches nothing from the network.

``render_page(data)`` returns the page's text for the data ``data.collect`` returns;
``write_report(paths, out)`` does both and writes the file.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["render_page", "write_report"]

_HERE = Path(__file__).resolve().parent


def render_page(data: dict[str, Any]) -> str:
    """The page for ``data`` (``data.collect``'s dict): a header, an error box, the
    ``<main>`` the script fills, the data as ``<script type="application/json">``."""
    # "<" escaped as \u003c: the JSON can never close its <script> element early.
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    title = html.escape(f"gpu_mem_track: {data.get('title', '')}")
    css = (_HERE / "report.css").read_text(encoding="utf-8")
    script = (_HERE / "report.js").read_text(encoding="utf-8")
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{title}</title>\n<style>\n{css}</style>\n</head>\n<body data-status='loading'>\n"
        f"<header><h1 id='gmt-title'>{title}</h1>"
        f"<p>gpu_mem_track {html.escape(str(data.get('version', '')))}: memory after each line, "
        "its increment and peak, in bytes of each run's memory source</p></header>\n"
        "<main id='gmt-main'><pre id='gmt-errors'></pre></main>\n"
        f"<script type='application/json' id='gmt-data'>{payload}</script>\n"
        f"<script>\n{script}</script>\n</body>\n</html>\n"
    )


def write_report(
    paths: Sequence[str | Path],
    out: str | Path,
    points: int | None = None,
    notes: list[str] | None = None,
    max_bytes: int | None = None,
) -> Path:
    """Collect ``paths`` (see ``data.collect``; ``max_bytes``: the most read of a raw
    snapshot, None: 4 GiB) and write the page to ``out``; returns the path written;
    ``notes``, when given, receives the page's notes (what was missing or cut, one line
    each). ``UsageError`` for an input that cannot be read or an output that cannot be
    written."""
    from .data import DEFAULT_POINTS, collect

    data = collect(paths, points or DEFAULT_POINTS, max_bytes)
    text = render_page(data)
    if notes is not None:
        notes.extend(data["notes"])
    target = Path(out)
    try:
        partial = target.with_name(target.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(target)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    return target
