"""``ranks``: rebuild and print the ranks table of a torchrun launch folder
(``runfolder.ranktable``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Command

__all__ = ["COMMAND"]


def prepare_parser(ranks: argparse.ArgumentParser) -> None:
    ranks.add_argument("launch", type=Path, help="a launch folder: reports/<launch>/ with rank<k>/ folders")


def run(args: argparse.Namespace) -> int:
    """Rewrite the launch folder's ranks.csv and report.txt from its ranks' meta.json
    files and print the report; a path that is no launch folder is a usage mistake."""
    from ..errors import UsageError
    from ..runfolder.ranktable import write_launch_files
    from ..runfolder.render import render_launch_report

    if not args.launch.is_dir():
        raise UsageError(f"no such launch folder: {args.launch}")
    try:
        summary = write_launch_files(args.launch)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write into {args.launch}: {exc.strerror or exc}") from None
    sys.stdout.write(render_launch_report(summary))
    return 0


COMMAND = Command(
    name="ranks",
    help="the ranks table of a torchrun launch folder, rebuilt",
    description="Rebuild ranks.csv and report.txt of a launch folder (what `gpu_mem_track run` "
    "writes under torchrun: reports/<launch>/rank<k>/) from its ranks' meta.json files and print "
    "the table: per rank its status (a rank without a clean end is marked), device, peak, the "
    "line and phase of the peak, memory at the end, and the spread of the peaks.",
    prepare_parser=prepare_parser,
    run=run,
)
