"""``show``: a MemTracker CSV or a run as text (``runs.show``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Command, notes

__all__ = ["COMMAND"]


def prepare_parser(show: argparse.ArgumentParser) -> None:
    show.add_argument(
        "report", type=Path, help="reports/<run>.csv, or reports/<run>/, its lines.csv or timeline.csv"
    )
    show.add_argument("--totals-only", action="store_true", help="leave out the changed tensor groups")


def run(args: argparse.Namespace) -> int:
    """Print the report; a missing, unreadable or foreign file is a usage mistake."""
    from ..runs.show import show_report

    shown = show_report(args.report, not args.totals_only)
    notes(shown.notes)
    sys.stdout.write(shown.text)
    return 0


COMMAND = Command(
    name="show",
    help="print a report as text: a MemTracker CSV or a run",
    description="Print a MemTracker CSV as the tracker's text log, or a run (its folder, lines.csv "
    "or timeline.csv) as its report.txt. A last row cut mid-write (a killed process) is left out, "
    "saying so on stderr.",
    prepare_parser=prepare_parser,
    run=run,
)
