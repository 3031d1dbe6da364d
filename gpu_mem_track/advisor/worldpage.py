"""``fit --nproc-per-node``'s answer as one self-contained HTML page, in the single-GPU
page's frame and style (``pageframe``): the script, ranks, GPU and capacity in the header;
the answer (the world sizes tried and the sentence, then the command and the lines to
write); the table (a row per trial, each row's figures the worst rank's, the
recommended row in bold); the levers not tried and why; what is not modelled. Its words
are the text answer's (``worldrender``'s pieces), so the two say the same thing.
``render_distributed_page`` returns the text; ``write_distributed_page`` writes it.
"""

from __future__ import annotations

import html
from pathlib import Path, PurePath

from .distributed import DistributedFit
from .pageframe import html_document, html_list, html_table, write_page
from .worldrender import NOT_MODELLED, heading, trials_line, verdict_lines, world_cells

__all__ = ["render_distributed_page", "write_distributed_page"]


def render_distributed_page(result: DistributedFit) -> str:
    """The page's text for ``result``."""
    answer = "".join(f"<p>{html.escape(line)}</p>" for line in verdict_lines(result))
    if result.launch:
        lines = html.escape("\n".join(result.launch))
        answer += f"<h3>Launch and lines to write</h3><pre>{lines}</pre>"
    header, body = world_cells(result)
    marks = [i == result.recommended for i in range(len(body))]
    sections = [
        f"<section><h2>Answer</h2>{answer}</section>",
        f"<section><h2>Trials</h2>{html_table(header, body, marks)}"
        f"<p class='note'>{html.escape(trials_line(result))}</p></section>",
    ]
    if result.not_applied:
        sections.append(f"<section><h2>Not tried</h2>{html_list(list(result.not_applied))}</section>")
    sections.append(f"<section><h2>Not modelled</h2><p>{html.escape(NOT_MODELLED)}</p></section>")
    title = f"gpu_mem_track fit: {PurePath(result.script).name} on {result.nproc} x {result.gpu}"
    return html_document(title, heading(result), sections)


def write_distributed_page(result: DistributedFit, out: str | Path) -> Path:
    """Write the page for ``result`` to ``out``; returns the path. ``UsageError`` when it
    cannot be written."""
    return write_page(render_distributed_page(result), out)
