"""What ``gpu-mem-track snapshot FILE.pickle[.gz] [...]`` does (its options are in
``commands/snapshot.py``): analyse PyTorch memory snapshots and write one runner-style
folder per snapshot (see ``folder``); with ``--compare B``, also compare the one FILE (A)
with B line by line (``compare``) into a folder of its own (``compare_folder``).

Every file is loaded and checked before anything is written: a missing file, a folder,
or anything that is not a memory snapshot is reported in one line with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import UsageError
from ..outputs import claim_folder, safe_name
from ..snapshotfile.records import Snapshot
from .compare import compare_analyses
from .compare_folder import write_comparison
from .compare_report import render_comparison
from .folder import load_checked, report_folder
from .report import render_summary

__all__ = ["run", "run_compare"]


def run(args: argparse.Namespace) -> int:
    """Analyse every file of ``args`` (the ``snapshot`` command's options: ``files``,
    ``include``, ``out_dir``, ``name``, ``device``, ``top``, ``max_bytes``); 0 on
    success. Every file is loaded before anything is written; a bad one raises
    ``UsageError``."""
    if getattr(args, "compare", None) is not None:
        return run_compare(args)
    snapshots = [load_checked(path, args.max_bytes) for path in args.files]
    for snapshot in snapshots:
        _analyse_one(snapshot, args)
    return 0


def _analyse_one(snapshot: Snapshot, args: argparse.Namespace) -> None:
    folder, analysis = report_folder(snapshot, args.out_dir, args.name, args.include, args.device, args.top)
    sys.stdout.write(render_summary(analysis, folder, min(args.top, 5) or 5))


def run_compare(args: argparse.Namespace) -> int:
    """``snapshot A --compare B``: both analysed as without ``--compare`` (a folder each,
    named as usual), then the comparison written to ``out_dir/<name>`` (default
    ``<A>-vs-<B>``) and printed. Both files are loaded before anything is written."""
    if len(args.files) != 1:
        raise UsageError(f"--compare compares one FILE with {args.compare}; {len(args.files)} were given")
    first, second = (load_checked(path, args.max_bytes) for path in (args.files[0], args.compare))
    for snapshot in (first, second):  # a device one lacks: said before anything is written
        if args.device is not None and args.device not in snapshot.devices():
            found = ", ".join(str(d) for d in snapshot.devices()) or "none"
            raise UsageError(f"{snapshot.source}: no device {args.device} in the snapshot (devices: {found})")
    sides = []
    for snapshot in (first, second):
        folder, analysis = report_folder(snapshot, args.out_dir, None, args.include, args.device, args.top)
        sides.append((folder, analysis))
    (folder_a, a), (folder_b, b) = sides
    comparison = compare_analyses(a.to_dict(), b.to_dict(), folder_a.name, folder_b.name)
    name = args.name or f"{folder_a.name}-vs-{folder_b.name}"
    target = claim_folder(Path(args.out_dir), safe_name(name))
    written = write_comparison(target, comparison, (folder_a, folder_b), args.top)
    sys.stdout.write(render_comparison(comparison, args.top))
    sys.stdout.write(f"Reports: {target}{os.sep} ({', '.join(written)}); A: {folder_a}, B: {folder_b}\n")
    return 0
