"""Benchmark: the line runner's overhead on a CPU training loop, against memory_profiler.

Runs ``scripts/bench/bench_train.py`` (a few hundred Adam steps of a small MLP, ten lines in the
loop body) in fresh processes, alternating in one session: plain, under
``python -m gpu_mem_track run`` and, when it is installed, under
``python -m memory_profiler`` (which profiles the ``@profile`` function line by line).
Reports the median and min of each, for the whole process (what a user waits for) and for
the training loop alone (timed by the script itself), and the ratios to plain. Target: our
whole-process wall time <= 1.15x plain. Writes a markdown report (``--out``) and the same
data as JSON next to it. The target is reported, not enforced.

    python3 scripts/bench/bench_runner.py [--rounds 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_RATIO = 1.15
WORKLOAD = Path(__file__).with_name("bench_train.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="runs of each variant (default: %(default)s)")
    parser.add_argument(
        "--steps", type=int, default=300, help="training steps per run (default: %(default)s)"
    )
    parser.add_argument("--device", default="cpu", help="device of the training loop (default: %(default)s)")
    parser.add_argument(
        "--out", default="reports/bench_runner.md", help="markdown report; JSON goes next to it (%(default)s)"
    )
    return parser.parse_args(argv)


def variants(steps: int, device: str, out_dir: str) -> dict[str, list[str]]:
    """The commands to compare, by name."""
    script = [str(WORKLOAD), str(steps), device]
    found = {
        "plain": [sys.executable, *script],
        "gpu_mem_track run": [
            sys.executable,
            "-m",
            "gpu_mem_track",
            "run",
            "--out-dir",
            out_dir,
            "--device",
            device,
            *script,
        ],
    }
    if device == "cpu" and sys.platform.startswith("linux"):
        # the C heap in use instead of RSS (glibc mallinfo2), same tracing
        found["gpu_mem_track run --memory heap"] = [
            *found["gpu_mem_track run"][: -len(script)],
            "--memory",
            "heap",
            *script,
        ]
    if device == "cpu":
        # live CPU tensor storages followed by a dispatch mode instead of RSS, same tracing
        found["gpu_mem_track run --memory tensors"] = [
            *found["gpu_mem_track run"][: -len(script)],
            "--memory",
            "tensors",
            *script,
        ]
    if importlib.util.find_spec("memory_profiler") is not None:
        found["memory_profiler"] = [sys.executable, "-m", "memory_profiler", *script]
    return found


def time_once(command: list[str]) -> tuple[float, float]:
    """(whole-process seconds, training-loop seconds as the script printed them)."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    loop = next(
        float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("train seconds")
    )
    return wall, loop


def measure(commands: dict[str, list[str]], rounds: int) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "loop": []} for name in commands}
    for round_index in range(rounds):
        order = list(commands) if round_index % 2 == 0 else list(reversed(commands))
        for name in order:
            wall, loop = time_once(commands[name])
            times[name]["wall"].append(wall)
            times[name]["loop"].append(loop)
            print(f"round {round_index + 1}: {name:<32} wall {wall:.3f} s  loop {loop:.3f} s", flush=True)
    return times


def summarize(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    plain = times["plain"]
    out = {}
    for name, series in times.items():
        row: dict[str, float] = {}
        for what in ("wall", "loop"):
            row[f"{what}_median"] = statistics.median(series[what])
            row[f"{what}_min"] = min(series[what])
            row[f"{what}_ratio_median"] = row[f"{what}_median"] / statistics.median(plain[what])
            row[f"{what}_ratio_min"] = row[f"{what}_min"] / min(plain[what])
        out[name] = row
    return out


def render(summary: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    ours = summary["gpu_mem_track run"]["wall_ratio_median"]
    verdict = "met" if ours <= TARGET_RATIO else "missed"
    lines = [
        "# Runner benchmark: line profiling overhead on a CPU training loop",
        "",
        f"Date {meta['date']}, commit {meta['commit']}, {meta['machine']}, Python {meta['python']}, "
        f"torch {meta['torch']}, engine {meta['engine']}. Workload: "
        f"`scripts/bench/bench_train.py {meta['steps']} {meta['device']}` "
        f"({meta['rounds']} runs of each, alternating). Command: `{meta['command']}`.",
        f"Machine load (1-minute load average) at start {meta['load_start']:.2f}, at end "
        f"{meta['load_end']:.2f}: other processes shared the {meta['machine'].split()[0]} cores"
        " when it is above about 1.",
        "",
        "| variant | wall median (s) | wall min (s) | wall / plain (median) "
        "| loop median (s) | loop / plain (median) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        lines.append(
            f"| {name} | {row['wall_median']:.3f} | {row['wall_min']:.3f} | {row['wall_ratio_median']:.2f} "
            f"| {row['loop_median']:.3f} | {row['loop_ratio_median']:.2f} |"
        )
    lines += [
        "",
        f"Target: whole-process wall time <= {TARGET_RATIO}x plain: **{verdict}** ({ours:.2f}x by medians).",
        "The loop columns time `train()` alone (inside the script), without interpreter and torch start-up.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out_dir:
        commands = variants(args.steps, args.device, out_dir)
        times = measure(commands, args.rounds)
    load_end = os.getloadavg()[0]
    summary = summarize(times)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": commit or "unknown",
        "machine": f"{os.cpu_count()} cores {platform.machine()}",
        "python": platform.python_version(),
        "interpreter": sys.executable,
        "torch": torch.__version__,
        "engine": "sys.monitoring" if hasattr(sys, "monitoring") else "sys.settrace",
        "steps": args.steps,
        "device": args.device,
        "rounds": args.rounds,
        "load_start": load_start,
        "load_end": load_end,
        "command": "python3 "
        + " ".join(["scripts/bench/bench_runner.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    write_report(args.out, render(summary, meta), {"meta": meta, "times": times, "summary": summary})
    return 0


def write_report(path: str, text: str, data: dict[str, Any]) -> None:
    """Print the report ``text``, write it to ``path`` (parent folders made) and ``data``
    as indented JSON beside it (``path`` with the suffix ``.json``); say where."""
    print(text)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    sys.exit(main())
