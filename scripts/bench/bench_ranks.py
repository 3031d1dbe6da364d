"""Benchmark: the line runner's overhead per rank under torchrun, against one process.

Runs ``scripts/bench/bench_train.py`` in fresh launches, alternating in one session (the order is
reversed every other round), with ``OMP_NUM_THREADS=1``:

- one process: ``python bench_train.py`` plain and under ``python -m gpu_mem_track run``
  (the two commands of ``scripts/bench/bench_runner.py``);
- 2 ranks: ``python -m torch.distributed.run --standalone --nproc-per-node 2 bench_train.py``
  plain and with ``-m gpu_mem_track run --out-dir <tmp>`` (no process group: the ranks only
  share the machine).

Records the whole launch's wall time and each rank's training-loop seconds (printed by the
script; torchrun's ``--tee 1`` prefixes them with the local rank), the medians over the
rounds, the ratios to plain, and the ``uptime`` load before and after. The question (issue
11): is the overhead per rank what it is for one process. Writes a markdown report
(``--out``) and the same data as JSON next to it.

    python3 scripts/bench/bench_ranks.py [--rounds 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import bench_runner  # scripts/ is sys.path[0] when this file runs as a script

NPROC = 2
RANK_LOOP = re.compile(r"^\[default(\d+)\]:train seconds (\S+)$")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant (default: %(default)s)")
    parser.add_argument(
        "--steps", type=int, default=300, help="training steps per run and rank (default: %(default)s)"
    )
    parser.add_argument(
        "--out", default="reports/bench_ranks.md", help="markdown report; JSON goes next to it (%(default)s)"
    )
    return parser.parse_args(argv)


def one_process(steps: int, out_dir: str) -> dict[str, list[str]]:
    """bench_runner's plain and ``gpu_mem_track run`` commands for one process on the CPU."""
    found = bench_runner.variants(steps, "cpu", out_dir)
    return {name: found[name] for name in ("plain", "gpu_mem_track run")}


def ranks(steps: int, out_dir: str, log_dir: str) -> dict[str, list[str]]:
    """The torchrun launches of NPROC ranks, plain and under ``gpu_mem_track run``."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launch += ["--nproc-per-node", str(NPROC), "--tee", "1", "--log-dir", log_dir]
    script = [str(bench_runner.WORKLOAD), str(steps), "cpu"]
    return {
        "plain": [*launch, *script],
        "gpu_mem_track run": [*launch, "-m", "gpu_mem_track", "run", "--out-dir", out_dir, *script],
    }


def time_launch(command: list[str]) -> tuple[float, list[float]]:
    """(whole-launch seconds, each rank's training-loop seconds in local-rank order)."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    loops = dict(m.groups() for m in map(RANK_LOOP.match, done.stdout.splitlines()) if m)
    if len(loops) != NPROC:
        raise SystemExit(f"expected {NPROC} ranks' train seconds, got {loops}: {' '.join(command)}")
    return wall, [float(loops[str(rank)]) for rank in range(NPROC)]


def measure(groups: dict[str, dict[str, list[str]]], rounds: int) -> dict[str, dict[str, Any]]:
    """Times of every group's variants; ``loop`` holds every rank's seconds, ``rank_loops`` per run."""
    jobs = [(group, name) for group, commands in groups.items() for name in commands]
    times: dict[str, dict[str, Any]] = {
        group: {name: {"wall": [], "loop": [], "rank_loops": []} for name in commands}
        for group, commands in groups.items()
    }
    for round_index in range(rounds):
        for group, name in jobs if round_index % 2 == 0 else reversed(jobs):
            command = groups[group][name]
            if group == "ranks":
                wall, loops = time_launch(command)
            else:
                wall, loop = bench_runner.time_once(command)
                loops = [loop]
            series = times[group][name]
            series["wall"].append(wall)
            series["loop"].extend(loops)
            series["rank_loops"].append(loops)
            shown = "/".join(f"{loop:.3f}" for loop in loops)
            print(
                f"round {round_index + 1}: {group:<11} {name:<18} wall {wall:.3f} s  loop {shown} s",
                flush=True,
            )
    return times


def uptime() -> str:
    """``uptime``'s line (load averages over 1, 5 and 15 minutes)."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def render_group(title: str, series: dict[str, Any], summary: dict[str, dict[str, float]]) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| variant | launch wall (s), each round | median "
        "| loop (s) per run (rank 0/rank 1 under torchrun) | loop median |",
        "|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        walls = ", ".join(f"{wall:.2f}" for wall in series[name]["wall"])
        loops = ", ".join("/".join(f"{x:.2f}" for x in run) for run in series[name]["rank_loops"])
        lines.append(f"| {name} | {walls} | {row['wall_median']:.2f} | {loops} | {row['loop_median']:.2f} |")
    ours = summary["gpu_mem_track run"]
    paired = [
        f"{run / plain:.2f}"
        for run, plain in zip(series["gpu_mem_track run"]["loop"], series["plain"]["loop"], strict=True)
    ]
    lines += [
        "",
        f"Ratios (medians): wall {ours['wall_ratio_median']:.2f}x, loop {ours['loop_ratio_median']:.2f}x. "
        "Loop against the "
        f"plain of the same round and rank, run by run: {', '.join(paired)}.",
        "",
    ]
    return lines


def render(times: dict[str, Any], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    one, two = summary["one process"]["gpu_mem_track run"], summary["ranks"]["gpu_mem_track run"]
    lines = [
        f"# Runner overhead per rank under torchrun ({NPROC} CPU ranks) against one process",
        "",
        f"Date {meta['date']}, commit {meta['commit']}, {meta['machine']}, Python {meta['python']}, "
        f"torch {meta['torch']}, engine {meta['engine']}, OMP_NUM_THREADS=1. Workload: "
        f"`scripts/bench/bench_train.py {meta['steps']} cpu` in each process or rank, "
        f"{meta['rounds']} rounds alternating in one session. Command: `{meta['command']}`.",
        f"Load (`uptime`) before: `{meta['uptime_start']}`; after: `{meta['uptime_end']}`. "
        "Above about 1 on these cores, other jobs shared the machine and moved the timings.",
        "",
        *render_group(
            "One process: `python` vs `python -m gpu_mem_track run`",
            times["one process"],
            summary["one process"],
        ),
        *render_group(
            f"{NPROC} ranks: `torchrun --standalone --nproc-per-node {NPROC}` vs with "
            "`-m gpu_mem_track run --out-dir <tmp>`",
            times["ranks"],
            summary["ranks"],
        ),
        f"Per rank the runner costs {two['loop_ratio_median']:.2f}x the plain loop, against "
        f"{one['loop_ratio_median']:.2f}x for one process (whole launch {two['wall_ratio_median']:.2f}x "
        f"against {one['wall_ratio_median']:.2f}x). The loop columns time `train()` alone, inside the "
        "script; the ranks' median is over every rank of every round.",
        "",
    ]
    return "\n".join(lines)


def metadata(args: argparse.Namespace, argv: list[str] | None, start: str, end: str) -> dict[str, Any]:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    return {
        "date": datetime.date.today().isoformat(),
        "commit": commit.strip() or "unknown",
        "machine": f"{os.cpu_count()} cores {platform.machine()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "engine": "sys.monitoring" if hasattr(sys, "monitoring") else "sys.settrace",
        "steps": args.steps,
        "rounds": args.rounds,
        "nproc": NPROC,
        "uptime_start": start,
        "uptime_end": end,
        "command": "python3 "
        + " ".join(["scripts/bench/bench_ranks.py", *(argv if argv is not None else sys.argv[1:])]),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    start = uptime()
    with tempfile.TemporaryDirectory() as tmp:
        groups = {
            "one process": one_process(args.steps, f"{tmp}/one"),
            "ranks": ranks(args.steps, f"{tmp}/ranks", f"{tmp}/logs"),
        }
        times = measure(groups, args.rounds)
    end = uptime()
    summary = {group: bench_runner.summarize(series) for group, series in times.items()}
    meta = metadata(args, argv, start, end)
    text = render(times, summary, meta)
    bench_runner.write_report(args.out, text, {"meta": meta, "times": times, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
