"""``compare``: two runs side by side (``runs.compare``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Command, count, notes

__all__ = ["COMMAND"]


def prepare_parser(compare: argparse.ArgumentParser) -> None:
    compare.add_argument(
        "a", type=Path, help="run A: reports/<run>/, its lines.csv or timeline.csv, or reports/<run>.csv"
    )
    compare.add_argument("b", type=Path, help="run B, compared with A (differences are B minus A)")
    compare.add_argument(
        "--by",
        choices=("line", "function", "label"),
        help="what to match: source lines, functions (increments summed) or track() labels "
        "(default: line when both runs have per-line records, else label)",
    )
    compare.add_argument(
        "--top",
        type=count,
        default=20,
        metavar="N",
        help="show the N largest differences (default: 20; 0: no limit, all of them)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the comparison, largest differences first."""
    from ..runs.compare import compare_files, render_comparison

    comparison = compare_files(args.a, args.b, args.by)
    notes(comparison.a.notes + comparison.b.notes)
    sys.stdout.write(render_comparison(comparison, args.top))
    return 0


COMMAND = Command(
    name="compare",
    help="two runs side by side, largest differences first",
    description="Compare two runs (runner folders, their lines.csv or timeline.csv, or MemTracker "
    "CSVs) per source line, per function or per track() label, largest difference first. Lines "
    "match by file name, function and code text, so edits that shift line numbers still match.",
    prepare_parser=prepare_parser,
    run=run,
)
