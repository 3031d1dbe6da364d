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
from collections.abc import Sequence
from pathlib import Path

from ..allocator.replay import replay
from ..errors import BadInput, TooLarge, UsageError
from ..outputs import claim_folder, safe_name
from ..runfolder.files import RunFolder
from ..snapshotfile.load import load_snapshot
from ..snapshotfile.records import Snapshot
from .analyse import SnapshotAnalysis, analyse, pick_device
from .attribution import Attributor
from .compare import compare_analyses
from .compare_folder import write_comparison
from .compare_report import render_comparison
from .folder import default_name, write_folder
from .phases import read_trace
from .report import render_summary

__all__ = ["load_checked", "report_folder", "run", "run_compare"]


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


def load_checked(path: Path, max_bytes: int | None = None) -> Snapshot:
    """The snapshot in ``path``, read up to ``max_bytes`` bytes on disk and once gunzipped
    (None: ``snapshotfile.load.MAX_BYTES``, 4 GiB); ``UsageError`` (one line) when it is
    missing or not one, and when it is larger, saying how to read more (``--max-bytes``)."""
    if not path.exists():
        raise UsageError(f"no such snapshot: {path}")
    try:
        return load_snapshot(path, max_bytes)
    except TooLarge as exc:
        raise BadInput(f"{exc}; --max-bytes SIZE (e.g. 8GiB) reads larger snapshots") from None


def _analyse_one(snapshot: Snapshot, args: argparse.Namespace) -> None:
    folder, analysis = report_folder(snapshot, args.out_dir, args.name, args.include, args.device, args.top)
    sys.stdout.write(render_summary(analysis, folder, min(args.top, 5) or 5))


def report_folder(
    snapshot: Snapshot,
    out_dir: Path,
    name: str | None = None,
    include: Sequence[str] = (),
    device: int | None = None,
    top: int = 10,
) -> tuple[Path, SnapshotAnalysis]:
    """Analyse ``snapshot`` (``device``: its CUDA index, default the one with the longest
    trace; ``include``: more paths counted as user code) and write its runner-style folder
    ``out_dir/name`` (default name: the file's, made unique); returns the folder and the
    analysis. ``UsageError`` for a device the snapshot lacks or a folder it cannot write."""
    chosen = pick_device(snapshot, device)
    if device is not None and chosen not in snapshot.devices():
        found = ", ".join(str(d) for d in snapshot.devices()) or "none"
        raise UsageError(f"{snapshot.source}: no device {chosen} in the snapshot (devices: {found})")
    attributor = Attributor(include)
    replayed = replay(snapshot, chosen)
    reading = read_trace(snapshot.device_trace(chosen), attributor)
    analysis = analyse(snapshot, replayed, attributor, reading)
    folder = RunFolder(claim_folder(Path(out_dir), safe_name(name or default_name(snapshot.source))))
    write_folder(folder, analysis, replayed, attributor, top, reading)
    return folder.path, analysis


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
