"""Benchmark: the census's FIRST calls in a fresh process, after an install and without one.

Two kinds of round, each a fresh process with a ``GPU_MEM_TRACK_CACHE`` of its own:

- ``installed``: the cache holds what an install from source builds (``setup.py`` runs
  ``python -m gpu_mem_track.native.build``, as this script does once, untimed, into a
  cache every round of this kind starts from): the census's native reader from the first call;
- ``empty``: an empty cache, as after installing a binary wheel or where no compiler is (``auto``
  mode, so the first census meeting 20,000 tensors starts the reader's build in the background,
  as it would for a user, and stops it when the round ends).

Each round makes the tensors of ``scripts/bench/bench_census.py``'s tensor curve (a model of ``--layers``
``Linear(4, 4)`` layers with gradients and Adam state, plain tensors, views), then times
``gc.get_objects()`` and ``MemTracker.track()`` alternately for the first ``--calls`` calls.
Reports, per kind and call number, the ratio ``track() / gc.get_objects()`` of each round (the
ratio of the two timings taken side by side, so a machine's drift cancels) as min, median and
max over the rounds. Writes markdown (``--out``) and JSON next to it.

    python scripts/bench/census_first.py [--tensors 100000] [--rounds 5] [--calls 3] [--kinds installed,empty]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
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
held = build_tensors({tensors}, {layers})
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


KINDS = {
    "installed": "after an install from source with a compiler (native modules built by setup.py)",
    "empty": "empty native cache (a binary wheel, or no compiler)",
}


def installed_cache(folder: str) -> None:
    """Build into ``folder`` what an install from source builds (setup.py's command)."""
    env = {**os.environ, "GPU_MEM_TRACK_CACHE": folder, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "gpu_mem_track.native.build", "--quiet"]
    if subprocess.run(command, env=env, check=False).returncode != 0:
        raise SystemExit("the native modules did not build here (no compiler or torch headers?)")


def one_round(tensors: int, layers: int, calls: int, start_from: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gmt-cache-") as cache:
        if start_from is not None:
            shutil.copytree(start_from, cache, dirs_exist_ok=True)
        env = {**os.environ, "GPU_MEM_TRACK_CACHE": cache, "GPU_MEM_TRACK_NATIVE": "auto"}
        code = CHILD.format(
            root=str(ROOT), scripts=str(bench_census_dir()), tensors=tensors, layers=layers, calls=calls
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(rounds: list[dict[str, Any]], calls: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Per call number: the spread of the timings and ratios over ``rounds``, and table rows."""
    per_call, rows = [], []
    for n in range(calls):
        ratios = [r["calls"][n]["track_s"] / r["calls"][n]["get_objects_s"] for r in rounds]
        entry = {
            "call": n + 1,
            "ratio": spread(ratios),
            "track_ms": spread([r["calls"][n]["track_s"] * 1e3 for r in rounds]),
            "get_objects_ms": spread([r["calls"][n]["get_objects_s"] * 1e3 for r in rounds]),
            "native_rounds": sum(r["calls"][n]["native"] for r in rounds),
        }
        per_call.append(entry)
        cells = [
            " / ".join(f"{entry[name][k]:.{digits}f}" for k in ("min", "median", "max"))
            for name, digits in (("track_ms", 1), ("get_objects_ms", 1), ("ratio", 2))
        ]
        rows.append(f"| {n + 1} | {' | '.join(cells)} | {entry['native_rounds']} of {len(rounds)} |")
    return per_call, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tensors", type=int, default=100_000, help="live tensors (default: %(default)s)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="fresh processes per kind (default: %(default)s)"
    )
    parser.add_argument(
        "--calls", type=int, default=3, help="first calls timed in each (default: %(default)s)"
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=100,
        help="the model's Linear layers, 10 named tensors each (default: %(default)s, as "
        "bench_census.py's tensor curve: 1,000 named tensors)",
    )
    parser.add_argument(
        "--kinds",
        default="installed,empty",
        help=f"kinds of round, comma-separated, of {', '.join(KINDS)} (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        default="reports/bench_census_first.md",
        help="markdown report; JSON beside it (%(default)s)",
    )
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        parser.error(f"--kinds: choose from {', '.join(KINDS)}")
    import torch

    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.platform()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "command": "python " + " ".join([str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]]),
    }
    lines = [
        f"# Census: the first calls at {args.tensors:,} live tensors",
        "",
        *(f"- {k}: {v}" for k, v in env.items()),
    ]
    data: dict[str, Any] = {"environment": env, "kinds": {}}
    with tempfile.TemporaryDirectory(prefix="gmt-installed-") as prepared:
        if "installed" in kinds:
            installed_cache(prepared)
        for kind in kinds:
            rounds = []
            for index in range(args.rounds):
                result = one_round(
                    args.tensors, args.layers, args.calls, prepared if kind == "installed" else None
                )
                rounds.append(result)
                text = "  ".join(
                    f"call {n + 1}: {c['track_s'] * 1e3:.1f} ms / {c['get_objects_s'] * 1e3:.1f} ms"
                    for n, c in enumerate(result["calls"])
                )
                print(f"{kind} round {index + 1}: {text}  ({result['status']})", flush=True)
            per_call, rows = summarize(rounds, args.calls)
            met = all(e["ratio"]["median"] <= TARGET_RATIO for e in per_call)
            data["kinds"][kind] = {"per_call": per_call, "rounds": rounds, "met": met}
            lines += [
                "",
                f"## {KINDS[kind][0].upper()}{KINDS[kind][1:]}",
                "",
                f"{len(rounds)} fresh processes; the census's reader at the end of a round: "
                f"{rounds[-1]['status']}.",
                "",
                "| call | track() ms (min / median / max) | gc.get_objects() ms (min / median / max) "
                "| ratio (min / median / max) | native reader used |",
                "|---|---|---|---|---|",
                *rows,
                "",
                f"Target: `track()` <= {TARGET_RATIO:g}x `gc.get_objects()` on the first calls (median): "
                f"**{'met' if met else 'not met'}**.",
            ]
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
