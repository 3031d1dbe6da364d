"""``show``: a MemTracker CSV report as the text report (``tracker.csvlog``, ``render``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Command

__all__ = ["COMMAND"]


def prepare_parser(show: argparse.ArgumentParser) -> None:
    show.add_argument("report", type=Path, help="CSV report (reports/<run>.csv)")
    show.add_argument("--totals-only", action="store_true", help="leave out the changed tensor groups")


def run(args: argparse.Namespace) -> int:
    """Print the report; a missing, unreadable or foreign file is a usage mistake."""
    from ..errors import UsageError
    from ..tracker.csvlog import read_stamps
    from ..tracker.render import render_stamps

    report: Path = args.report
    try:
        stamps = read_stamps(report)
    except FileNotFoundError:
        raise UsageError(f"no such report: {report}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {report}: {exc}") from None
    except (ValueError, KeyError) as exc:
        raise UsageError(f"{report} is not a gpu_mem_track CSV report ({exc})") from None
    sys.stdout.write(render_stamps(stamps, not args.totals_only))
    return 0


COMMAND = Command(
    name="show",
    help="print a CSV report as the text report",
    description="Render a CSV report written by MemTracker as the text report.",
    prepare_parser=prepare_parser,
    run=run,
)
