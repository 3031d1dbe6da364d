"""``gpus``: the GPUs ``run --simulate`` knows by name (``simgpu.GPUS``)."""

from __future__ import annotations

import argparse
import json
import sys

from . import Command

__all__ = ["COMMAND"]


def prepare_parser(gpus: argparse.ArgumentParser) -> None:
    gpus.add_argument("--json", action="store_true", help="print the catalog as JSON (sizes in bytes)")


def run(args: argparse.Namespace) -> int:
    """Print the catalog."""
    from ..simgpu.catalog import GPUS
    from ..simgpu.table import gpus_dict, render_gpus

    specs = list(GPUS.values())
    sys.stdout.write(json.dumps(gpus_dict(specs), indent=2) + "\n" if args.json else render_gpus(specs))
    return 0


COMMAND = Command(
    name="gpus",
    help="list the GPUs run --simulate knows by name",
    description="List the named GPUs of run --simulate GPU (names are case-insensitive; a model "
    "alone, such as h100 or 4090, names the one GPU of that model) with the total "
    "memory torch reports, compute capability, the cuBLAS workspace PyTorch allocates per handle and "
    "stream, the non-PyTorch memory (the CUDA context, and the cuBLAS/cuDNN handles where measured) and "
    "the capacity left to the caching allocator, and where each "
    "memory figure comes from. Any other GPU: --simulate SIZE:smXY (e.g. 24GiB:sm86).",
    prepare_parser=prepare_parser,
    run=run,
)
