"""``compare``: two runs side by side (``runs.compare``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Command, count, notes

__all__ = ["COMMAND"]


def prepare_parser(compare: argparse.ArgumentParser) -> None:
    compare.add_argument(
        "a",
        type=Path,
        help="run A: reports/<run>/, its lines.csv or timeline.csv, reports/<run>.csv, or a "
        "launch folder of a torchrun launch (reports/<launch>/ with rank<k>/ folders)",
    )
    compare.add_argument(
        "b",
        type=Path,
        nargs="?",
        help="run B, compared with A (differences are B minus A); with --by rank, optional: "
        "without it the ranks of launch A are compared with its rank 0",
    )
    compare.add_argument(
        "--by",
        choices=("line", "function", "label", "rank"),
        help="what to match: source lines, functions (increments summed), track() labels or the "
        "ranks of launch folders (default: rank for a launch folder, else line when both runs "
        "have per-line records, else label)",
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
    from ..errors import UsageError
    from ..ranks import is_launch_folder
    from ..runs.compare import compare_files, render_comparison
    from ..runs.ranks import compare_launches, render_rank_comparison

    if args.by == "rank" or (args.by is None and is_launch_folder(args.a)):
        sys.stdout.write(render_rank_comparison(compare_launches(args.a, args.b)))
        return 0
    if args.b is None:
        raise UsageError("compare needs two runs (one launch folder only with --by rank)")
    comparison = compare_files(args.a, args.b, args.by)
    notes(comparison.a.notes + comparison.b.notes)
    sys.stdout.write(render_comparison(comparison, args.top))
    return 0


COMMAND = Command(
    name="compare",
    help="two runs side by side, largest differences first",
    description="Compare two runs (runner folders, their lines.csv or timeline.csv, or MemTracker "
    "CSVs) per source line, per function or per track() label, largest difference first. Lines "
    "match by file name, function and code text, so edits that shift line numbers still match. "
    "--by rank compares the ranks of one torchrun launch folder (each against rank 0), or two "
    "launch folders rank by rank: peak, the line and phase of the peak, memory at the end.",
    prepare_parser=prepare_parser,
    run=run,
)
