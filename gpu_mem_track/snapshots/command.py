"""``gpu-mem-track snapshot FILE.pickle[.gz] [...]``: analyse PyTorch memory snapshots and
write one runner-style folder per snapshot (see ``folder``).

Every file is loaded and checked before anything is written: a missing file, a folder,
or anything that is not a memory snapshot is reported in one line with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from .analyse import analyse, pick_device
from .attribution import Attributor
from .folder import claim_folder, default_name, write_folder
from .load import load_snapshot
from .records import Snapshot
from .replay import replay
from .report import render_summary

__all__ = ["add_parser", "run"]


HELP = "analyse PyTorch memory snapshots (torch.cuda.memory._dump_snapshot) line by line"
DESCRIPTION = (
    "Read memory snapshots written by torch.cuda.memory._dump_snapshot (pickles, "
    "gzip-compressed or not; read without running anything they contain) and report, as the "
    "runner reports a script: the peak of allocated bytes replayed from the trace with its time "
    "and line, reserved bytes, the cache and largest free block at the peak, and per source "
    "line and phase the bytes live at the peak and allocated in total. Writes reports/<name>/ "
    "(report.txt, lines.csv, timeline.csv, meta.json, snapshot_lines.csv, snapshot.json), "
    "which compare and plot read like a run."
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``snapshot`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser("snapshot", help=HELP, description=DESCRIPTION)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``snapshot`` subcommand's arguments to ``parser``."""
    parser.add_argument(
        "files", type=Path, nargs="+", metavar="FILE", help="snapshot files (.pickle, .pickle.gz)"
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
        "--name", help="report folder name (default: the file name without .pickle.gz; -2, -3... if taken)"
    )
    parser.add_argument(
        "--device",
        type=_count,
        metavar="N",
        help="CUDA device index to analyse (default: the one with the longest trace)",
    )
    parser.add_argument(
        "--top",
        type=_count,
        default=10,
        metavar="N",
        help="lines in each table of the report (default: 10; 0: all)",
    )


def run(args: argparse.Namespace) -> int:
    """Analyse every file of ``args``; 0 on success, 2 on a usage mistake."""
    try:
        snapshots = [_load(path) for path in args.files]
        for snapshot in snapshots:
            _analyse_one(snapshot, args)
    except UsageError as exc:
        print(f"gpu_mem_track: {exc}", file=sys.stderr)
        return 2
    return 0


def _load(path: Path) -> Snapshot:
    if not path.exists():
        raise UsageError(f"no such snapshot: {path}")
    return load_snapshot(path)


def _analyse_one(snapshot: Snapshot, args: argparse.Namespace) -> None:
    device = pick_device(snapshot, args.device)
    if args.device is not None and device not in snapshot.devices():
        found = ", ".join(str(d) for d in snapshot.devices()) or "none"
        raise UsageError(f"{snapshot.source}: no device {device} in the snapshot (devices: {found})")
    attributor = Attributor(args.include)
    replayed = replay(snapshot, device)
    analysis = analyse(snapshot, replayed, attributor)
    folder = claim_folder(args.out_dir, args.name or default_name(snapshot.source))
    write_folder(folder, analysis, replayed, attributor, args.top)
    sys.stdout.write(render_summary(analysis, folder.path, min(args.top, 5) or 5))


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a count >= 0: {text!r}")
    return value
