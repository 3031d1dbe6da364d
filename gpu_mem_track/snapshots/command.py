"""What ``gpu-mem-track snapshot FILE.pickle[.gz] [...]`` does (its options are in
``commands/snapshot.py``): analyse PyTorch memory snapshots and write one runner-style
folder per snapshot (see ``folder``).

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

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Analyse every file of ``args`` (the ``snapshot`` command's options: ``files``,
    ``include``, ``out_dir``, ``name``, ``device``, ``top``); 0 on success. Every file is
    loaded before anything is written; a bad one raises ``UsageError``."""
    snapshots = [_load(path) for path in args.files]
    for snapshot in snapshots:
        _analyse_one(snapshot, args)
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
