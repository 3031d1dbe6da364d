"""``snapshot``: PyTorch memory snapshots analysed line by line (``snapshots.command``)."""

from __future__ import annotations

import argparse

from . import Command

__all__ = ["COMMAND"]


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    from ..snapshots.command import add_arguments

    add_arguments(parser)


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
    "which compare and plot read like a run.",
    prepare_parser=prepare_parser,
    run=run,
)
