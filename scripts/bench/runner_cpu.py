"""Benchmark: ``gpu-mem-track run`` against plain python by CPU time, in fresh processes.

Each round runs ``bench_train.py STEPS cpu`` plainly, then under ``python -m gpu_mem_track
run`` once per checkout given (``--src``, default this one), in turn, so a machine's drift
spreads over all of them. A process's cost is its CPU time, user + sys, as the operating
system accounts it when it ends (``os.wait4``): on a shared machine wall time mostly
measures the other jobs. Every child runs with ``OMP_NUM_THREADS=1`` (torch's spinning
intra-op threads would add their own spread). Prints, for each checkout, the CPU seconds
(median) and the ratio to the plain run of the same round (min / median / max), then the
same as JSON. One warm-up round first, not counted.

``--collections`` starts every child (plain and runs alike) through a few lines that count
the full garbage collections (generation 2) before the interpreter exits and their CPU
seconds (``gc.callbacks``), and reports their medians too.

The line sink should be built beforehand for each checkout (``python -m
gpu_mem_track.native.build --module line_sink``, with the same ``GPU_MEM_TRACK_CACHE``),
so that each round times the native path a run takes once the build is there.

    python scripts/bench/runner_cpu.py [--rounds 9] [--steps 300] [--src DIR ...] [--collections]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).with_name("bench_train.py")

#: Counts the full collections; prints them at exit (the hook runs after the program's own).
COUNTING = r"""
import atexit, gc, sys, time
_full = [0, 0.0, 0.0]
def _count(phase, info):
    if info["generation"] == 2:
        if phase == "start":
            _full[2] = time.process_time()
        else:
            _full[0] += 1
            _full[1] += time.process_time() - _full[2]
gc.callbacks.append(_count)
atexit.register(lambda: print(f"full collections {_full[0]} {_full[1]:.6f}", file=sys.stderr))
"""
PLAIN = "import os, runpy; sys.argv = sys.argv[1:]; sys.path[0] = os.path.dirname(sys.argv[0])\n"
PLAIN += "runpy.run_path(sys.argv[0], run_name='__main__')\n"
RUN = "from gpu_mem_track.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def commands(steps: int, out_dir: str, collections: bool) -> tuple[list[str], list[str]]:
    """The plain command and the run's (without the checkout, which PYTHONPATH names)."""
    script = [str(WORKLOAD), str(steps), "cpu"]
    run = ["run", "--out-dir", out_dir, *script]
    if collections:
        return [sys.executable, "-c", COUNTING + PLAIN, *script], [sys.executable, "-c", COUNTING + RUN, *run]
    return [sys.executable, *script], [sys.executable, "-m", "gpu_mem_track", *run]


def timed(command: list[str], env: dict[str, str], cwd: str) -> tuple[float, int | None, float | None]:
    """CPU seconds of the finished child, and its full collections (count, seconds) when counted."""
    pipe = subprocess.PIPE
    child = subprocess.Popen(command, env=env, cwd=cwd, stdout=pipe, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{command} failed:\n{output[-3000:]}")
    found = re.search(r"full collections (\d+) ([\d.]+)", output)
    count, seconds = (int(found.group(1)), float(found.group(2))) if found else (None, None)
    return usage.ru_utime + usage.ru_stime, count, seconds


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9, help="counted rounds (default: %(default)s)")
    parser.add_argument(
        "--steps", type=int, default=300, help="training steps per run (default: %(default)s)"
    )
    parser.add_argument("--src", action="append", help="a checkout to run (repeatable; default: this one)")
    parser.add_argument(
        "--collections", action="store_true", help="count each child's full garbage collections (see above)"
    )
    args = parser.parse_args(argv)
    sources = args.src or [str(ROOT)]
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    Timing = tuple[float, int | None, float | None]
    rows: dict[str, list[Timing]] = {"plain": [], **{src: [] for src in sources}}
    with tempfile.TemporaryDirectory() as out_dir:
        plain, run = commands(args.steps, out_dir, args.collections)
        for round_ in range(args.rounds + 1):
            got = {"plain": timed(plain, base, str(ROOT))}
            for src in sources:
                got[src] = timed(run, {**base, "PYTHONPATH": src}, src)
            if round_:  # the first round warms the caches
                for name, value in got.items():
                    rows[name].append(value)
    result = {}
    for name, values in rows.items():
        ratios = [value[0] / plain_value[0] for value, plain_value in zip(values, rows["plain"])]
        entry = {
            "cpu_median": statistics.median(value[0] for value in values),
            "ratio": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)},
        }
        line = f"{name}: CPU s median {entry['cpu_median']:.2f}, ratio to plain {spread(ratios)}"
        if args.collections:
            entry["full_collections_median"] = statistics.median(value[1] or 0 for value in values)
            entry["full_collection_seconds_median"] = statistics.median(value[2] or 0.0 for value in values)
            line += (
                f", full collections {entry['full_collections_median']:g} "
                f"({entry['full_collection_seconds_median']:.3f} s) median"
            )
        result[name] = entry
        print(line)
    print(json.dumps({"rounds": args.rounds, "steps": args.steps, "results": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
