"""The folder of ``snapshot A --compare B``: ``compare.txt`` (``compare_report``),
``compare_lines.csv``, ``compare_phases.csv``, ``compare_sizes.csv`` (columns in
``compare_report``), ``compare.json`` (``SnapshotComparison.to_dict``) and
``compare.html``: the HTML page of the two snapshots' report folders, whose comparison
section is this comparison (``html.snapshot``)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError
from .compare import SnapshotComparison
from .compare_report import render_comparison, write_lines_csv, write_phases_csv, write_sizes_csv

__all__ = ["COMPARE_FILES", "write_comparison"]

#: The files written, in order.
COMPARE_FILES = (
    "compare.txt",
    "compare_lines.csv",
    "compare_phases.csv",
    "compare_sizes.csv",
    "compare.json",
    "compare.html",
)


def write_comparison(
    folder: Path, comparison: SnapshotComparison, sides: tuple[Path, Path], top: int = 10
) -> tuple[str, ...]:
    """Write ``COMPARE_FILES`` into ``folder`` (``top``: lines in ``compare.txt``, 0: all;
    ``sides``: the report folders of A and B, for the page); returns the names written.
    ``UsageError`` when the folder cannot be written."""
    from ..html.page import write_report

    try:
        (folder / "compare.txt").write_text(render_comparison(comparison, top), encoding="utf-8")
        for name, write in (
            ("compare_lines.csv", write_lines_csv),
            ("compare_phases.csv", write_phases_csv),
            ("compare_sizes.csv", write_sizes_csv),
        ):
            with (folder / name).open("w", encoding="utf-8", newline="") as stream:
                write(stream, comparison)
        text = json.dumps(comparison.to_dict(), indent=1) + "\n"
        (folder / "compare.json").write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {folder}: {exc.strerror or exc}") from exc
    write_report(list(sides), folder / "compare.html")
    return COMPARE_FILES
