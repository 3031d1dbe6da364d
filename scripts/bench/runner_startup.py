"""Benchmark: the CPU time ``gpu-mem-track run`` spends on its own modules before the script.

A run's fixed cost over plain Python is mostly importing the runner (the script imports
torch either way). Each round is a fresh process that imports torch (as the script would,
untimed), then times with ``time.process_time()`` what a run imports and does before the
script starts: the CLI and its parser, the runner, the run folder's renderer and the line
sink's lookup (``native.linesink.module()``). Reports min / median / max over the rounds
for each checkout given (``--src``, default this one), alternating, so a machine's drift
spreads over both. CPU time, not wall: on a shared machine wall time mostly measures the
other jobs.

    python scripts/bench/runner_startup.py [--rounds 7] [--src DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import time
import torch
from torch import nn
import torch.optim
p = time.process_time
start = p()
import gpu_mem_track.cli as cli
cli.build_parser()
import gpu_mem_track.runner.run
import gpu_mem_track.runfolder.render
from gpu_mem_track.native import linesink
linesink.module()
print(p() - start)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=7, help="fresh processes per checkout (default: %(default)s)"
    )
    parser.add_argument("--src", action="append", help="a checkout to time (repeatable; default: this one)")
    args = parser.parse_args(argv)
    sources = args.src or [str(ROOT)]
    seconds: dict[str, list[float]] = {src: [] for src in sources}
    for _ in range(args.rounds):
        for src in sources:
            env = {**os.environ, "PYTHONPATH": src}
            # cwd: ``python -c`` puts the working folder first on sys.path
            done = subprocess.run(
                [sys.executable, "-c", CHILD], env=env, cwd=src, capture_output=True, text=True, check=True
            )
            seconds[src].append(float(done.stdout.split()[-1]))
    result = {}
    for src, values in seconds.items():
        result[src] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
        print(
            f"{src}: {result[src]['min'] * 1e3:.0f} / {result[src]['median'] * 1e3:.0f} / "
            f"{result[src]['max'] * 1e3:.0f} ms CPU (min / median / max of {len(values)})"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
