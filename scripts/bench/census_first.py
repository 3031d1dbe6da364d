"""Benchmark: the census's FIRST calls in a fresh process with an empty native cache.

What a user meets before the census's native reader is built: each round starts a fresh
process whose ``GPU_MEM_TRACK_CACHE`` is an empty temporary folder (``auto`` mode, so the
first census meeting 20,000 tensors starts the reader's build in the background, as it
would for a user), makes the tensors of ``scripts/bench/bench_census.py``'s tensor curve (a
model of ``Linear(4, 4)`` layers with gradients and Adam state, plain tensors, views),
then times ``gc.get_objects()`` and ``MemTracker.track()`` alternately for the first
``--calls`` calls. The background build, if one started, is stopped when the round ends.
Reports, per call number, the ratio ``track() / gc.get_objects()`` of each round (the
ratio of the two timings taken side by side, so a machine's drift cancels) as min,
median and max over the rounds. Writes markdown (``--out``) and JSON next to it.

    python scripts/bench/census_first.py [--tensors 100000] [--rounds 5] [--calls 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TARGET_RATIO = 3.0

CHILD = r"""
import gc, json, os, signal, subprocess, sys, time
sys.path[:0] = [{root!r}, {scripts!r}]
from bench_census import build_tensors
from gpu_mem_track import MemTracker, native
held = build_tensors({tensors})
tracker = MemTracker(verbosity=0, probe=False)
calls = []
for _ in range({calls}):
    start = time.perf_counter(); objects = gc.get_objects(); scan = time.perf_counter() - start
    del objects
    start = time.perf_counter(); stamp = tracker.track(); track = time.perf_counter() - start
    calls.append({{"get_objects_s": scan, "track_s": track, "path": tracker.last_scan,
                   "native": native.loaded() is not None}})
status = native.status()
builder = native._state["builder"]
if isinstance(builder, subprocess.Popen) and builder.poll() is None:
    os.killpg(builder.pid, signal.SIGTERM)  # this round's background build: not wanted here
    builder.wait()
print(json.dumps({{"calls": calls, "status": status}}))
"""


def bench_census_dir() -> Path:
    """The folder holding bench_census.py (scripts/, or scripts/bench/ once moved there)."""
    for folder in (ROOT / "scripts", ROOT / "scripts" / "bench"):
        if (folder / "bench_census.py").is_file():
            return folder
    raise SystemExit("bench_census.py not found under scripts/")


def one_round(tensors: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gmt-empty-cache-") as cache:
        env = {**os.environ, "GPU_MEM_TRACK_CACHE": cache, "GPU_MEM_TRACK_NATIVE": "auto"}
        code = CHILD.format(root=str(ROOT), scripts=str(bench_census_dir()), tensors=tensors, calls=calls)
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tensors", type=int, default=100_000, help="live tensors (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes (default: %(default)s)")
    parser.add_argument(
        "--calls", type=int, default=3, help="first calls timed in each (default: %(default)s)"
    )
    parser.add_argument(
        "--out",
        default="reports/bench_census_first.md",
        help="markdown report; JSON beside it (%(default)s)",
    )
    args = parser.parse_args(argv)
    rounds = []
    for index in range(args.rounds):
        result = one_round(args.tensors, args.calls)
        rounds.append(result)
        text = "  ".join(
            f"call {n + 1}: {c['track_s'] * 1e3:.1f} ms / {c['get_objects_s'] * 1e3:.1f} ms"
            for n, c in enumerate(result["calls"])
        )
        print(f"round {index + 1}: {text}  ({result['status']})", flush=True)
    rows = []
    per_call = []
    for n in range(args.calls):
        ratios = [r["calls"][n]["track_s"] / r["calls"][n]["get_objects_s"] for r in rounds]
        track = [r["calls"][n]["track_s"] * 1e3 for r in rounds]
        scan = [r["calls"][n]["get_objects_s"] * 1e3 for r in rounds]
        native_used = sum(r["calls"][n]["native"] for r in rounds)
        entry = {
            "call": n + 1,
            "ratio": spread(ratios),
            "track_ms": spread(track),
            "get_objects_ms": spread(scan),
        }
        entry["native_rounds"] = native_used
        per_call.append(entry)
        rows.append(
            f"| {n + 1} | {entry['track_ms']['min']:.1f} / {entry['track_ms']['median']:.1f} / "
            f"{entry['track_ms']['max']:.1f} | {entry['get_objects_ms']['min']:.1f} / "
            f"{entry['get_objects_ms']['median']:.1f} / {entry['get_objects_ms']['max']:.1f} | "
            f"{entry['ratio']['min']:.2f} / {entry['ratio']['median']:.2f} / {entry['ratio']['max']:.2f} | "
            f"{native_used} of {len(rounds)} |"
        )
    import torch

    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.platform()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "command": "python " + " ".join([str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]]),
    }
    met = all(e["ratio"]["median"] <= TARGET_RATIO for e in per_call)
    lines = [
        f"# Census: the first calls at {args.tensors:,} live tensors, empty native cache",
        "",
        *(f"- {k}: {v}" for k, v in env.items()),
        f"- rounds: {len(rounds)} fresh processes, each with an empty `GPU_MEM_TRACK_CACHE`",
        f"- status at the end of a round: {rounds[-1]['status']}",
        "",
        "| call | track() ms (min / median / max) | gc.get_objects() ms (min / median / max) "
        "| ratio (min / median / max) | native reader used |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Target: `track()` <= {TARGET_RATIO:g}x `gc.get_objects()` on the first calls (median): "
        f"**{'met' if met else 'not met'}**.",
        "",
    ]
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    data = {"environment": env, "per_call": per_call, "rounds": rounds}
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
