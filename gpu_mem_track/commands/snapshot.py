"""``snapshot``: PyTorch memory snapshots analysed line by line (``snapshots.command``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import Command, add_max_bytes, count

__all__ = ["COMMAND"]


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", type=Path, nargs="+", metavar="FILE", help="snapshot files (.pickle, .pickle.gz)"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="B",
        help="compare the one FILE (A) with snapshot B line by line: per line and per phase the bytes "
        "each allocated, held at its peak, and the request sizes whose counts differ, largest "
        "difference first (B minus A). Lines are matched by file, line number and function; files by "
        "name, and where names repeat by the most trailing folders their paths share, so paths "
        "recorded on another machine still match. Writes both analyses as usual and "
        "reports/<A>-vs-<B>/ (compare.txt, compare_lines.csv, compare_phases.csv, "
        "compare_sizes.csv, compare.json, compare.html)",
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATH_OR_MODULE",
        help="also count frames of this file, folder, module or package as user code (repeatable; "
        "matched against the recorded paths as path components); otherwise only Python files outside "
        "torch, the standard library and installed packages count",
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path("reports"), help="folder of report folders (default: reports)"
    )
    parser.add_argument(
        "--name",
        help="report folder name (default: the file name without .pickle.gz; with --compare, the "
        "comparison's folder, default <A>-vs-<B>; -2, -3... if taken)",
    )
    parser.add_argument(
        "--device",
        type=count,
        metavar="N",
        help="CUDA device index to analyse (default: the one with the longest trace)",
    )
    parser.add_argument(
        "--top",
        type=count,
        default=10,
        metavar="N",
        help="lines in each table of the report (default: 10; 0: all)",
    )
    add_max_bytes(parser)


def run(args: argparse.Namespace) -> int:
    from ..snapshots.command import run as run_snapshot

    return run_snapshot(args)


COMMAND = Command(
    name="snapshot",
    help="analyse PyTorch memory snapshots (torch.cuda.memory._dump_snapshot) line by line",
    description="Read memory snapshots written by torch.cuda.memory._dump_snapshot (pickles, "
    "gzip-compressed or not; read without running anything they contain) and report, as the "
    "runner reports a script: the peak of allocated bytes replayed from the trace with its time "
    "and line, reserved bytes, the cache and largest free block at the peak, and per source "
    "line and phase the bytes live at the peak and allocated in total. Writes reports/<name>/ "
    "(report.txt, lines.csv, timeline.csv, meta.json, snapshot_lines.csv, snapshot.json), "
    "which compare and plot read like a run. With --compare B, also compares FILE with B line by "
    "line and phase by phase.",
    prepare_parser=prepare_parser,
    run=run,
)
