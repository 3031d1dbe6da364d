"""``plot``: memory over time for one or more runs (``runs.plot``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import Command, notes, report

__all__ = ["COMMAND"]


def prepare_parser(plot: argparse.ArgumentParser) -> None:
    plot.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="reports/<run>/, its timeline.csv, reports/<run>.csv, or a torchrun launch folder "
        "(reports/<launch>/: its ranks overlaid)",
    )
    plot.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("timeline.png"),
        help="image to write; the format follows the suffix: png, svg, pdf; without a suffix, .png "
        "is appended (default: timeline.png)",
    )
    plot.add_argument("--title", help="chart title (default: the runs' names)")


def run(args: argparse.Namespace) -> int:
    """Write the image; exit 1 when matplotlib is missing."""
    from ..runs.plot import PlotUnavailable, plot_files

    try:
        plotted = plot_files(args.runs, args.output, args.title)
    except PlotUnavailable as exc:
        report(str(exc))
        return 1
    notes(plotted.notes)
    print(f"wrote {plotted.path}")
    return 0


COMMAND = Command(
    name="plot",
    help="draw memory over time for one or more runs (needs matplotlib)",
    description="Draw memory over time like mprof plot: allocated (or RSS / tensor bytes on the CPU), "
    "reserved and driver memory where recorded, the peak marked, track() labels annotated; several "
    "runs overlay; a torchrun launch folder draws its ranks overlaid. "
    'Needs matplotlib: pip install "gpu_mem_track[plot]".',
    prepare_parser=prepare_parser,
    run=run,
)
