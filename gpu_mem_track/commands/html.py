"""``html``: one self-contained HTML page of runs (``html.page.write_report``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Command, add_max_bytes, notes

__all__ = ["COMMAND"]


def prepare_parser(html: argparse.ArgumentParser) -> None:
    html.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN_OR_CSV_OR_SNAPSHOT",
        help="a run folder (reports/<run>/, with its rank<k>/ subfolders if any), its lines.csv "
        "or timeline.csv, a MemTracker CSV, a memory snapshot (.pickle[.gz], analysed as the "
        "snapshot command does) or its folder; two runs are also compared",
    )
    html.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("report.html"),
        help="the page to write (default: report.html)",
    )
    html.add_argument(
        "--points",
        type=int,
        default=None,
        metavar="N",
        help="timeline buckets per run (each keeps its lowest and highest value; default 2000)",
    )
    add_max_bytes(html)


def run(args: argparse.Namespace) -> int:
    """Write the page and say where."""
    from ..errors import UsageError
    from ..html.page import write_report

    if args.points is not None and args.points < 1:
        raise UsageError(f"--points must be at least 1, not {args.points}")
    said: list[str] = []
    written = write_report(args.runs, args.output, args.points, said, args.max_bytes)
    notes(said)
    print(f"Wrote {written}", file=sys.stderr)
    return 0


COMMAND = Command(
    name="html",
    help="one self-contained HTML page: timeline, lines, censuses, ranks, comparison",
    description="Write one HTML file (no network access needed to view it) showing each run's memory "
    "timeline (drag to zoom, double-click to reset, hover for the line and value), its per-line "
    "table (click a header to sort, pick a file to filter), its censuses (census.csv, tracker.csv) "
    "and its ranks (rank<k>/ subfolders); with two runs, also their comparison (by line when both "
    "have per-line records, else by track() label). Memory snapshots (torch.cuda.memory._dump_snapshot) "
    "are analysed as the snapshot command does.",
    prepare_parser=prepare_parser,
    run=run,
)
