"""fit's simulated ranks against real gloo ranks, line by line (for reports/fit_distributed.md).

For a small DDP and a small FSDP2 script (AdamW, 3 steps), the real side runs both ranks
under ``torchrun --standalone --nproc-per-node 2`` with gloo on the CPU, through
``gpu_mem_track run --device cpu --memory tensors`` (each line's figure: the bytes of the
live CPU tensor storages, unrounded). The simulated side runs each rank alone as
``fit --nproc-per-node 2`` does (torchrun's variables from ``advisor.world.rank_environ``,
torch's fake process group) under ``run --simulate H100-80GB --census-threshold 0``: a
census after every line execution that does not lower memory.

Like with like: the simulated GPU's ``memory`` is allocator blocks (requests rounded up to
512 bytes) plus memory no tensor owns (cuBLAS's and cuBLASLt's workspaces). The simulated
ranks run with ``CUBLAS_WORKSPACE_CONFIG=:0:0`` (no workspaces, as on a GPU), and the
census's totals row gives ``requested``: the allocator's requested bytes, unrounded, which
is what ``--memory tensors`` counts on the CPU. (The census's own tensor count, in
blocks, now equals the allocated blocks at every census of the FSDP2 script's two ranks:
it counts a DTensor as its local shard. Before, it also counted each DTensor at its
global size, up to 40.8 MiB over the allocated.)
The allocated blocks are shown beside it. The two timelines are aligned by (line,
function, how many times that line had run).

The model moves to the device before ``fully_shard``: chosen when, with a census after
every line, the census's weak references to the parameters made ``fully_shard(model)``
then ``model.to("cuda")`` fail (``_apply(): Couldn't swap Linear.weight``: FSDP2's DTensor
parameters are moved by ``torch.utils.swap_tensors``, which refuses a tensor that has a
weak reference). That is fixed (``tracker/swapguard.py``); the order is kept so the
report's tables stay this script's.

    python scripts/check/check_fit_ranks.py              # prints the markdown tables
    python scripts/check/check_fit_ranks.py --keep DIR   # keeps the run folders in DIR
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GPU = "H100-80GB"
WORKLOAD = """
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

STRATEGY = sys.argv[1]
device = "cuda" if torch.cuda.is_available() else "cpu"
dist.init_process_group("nccl" if device == "cuda" else "gloo")


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


model = nn.Sequential(nn.Linear(128, 256), *[Block(256) for _ in range(4)], nn.Linear(256, 10))
model = model.to(device)
if STRATEGY == "fsdp2":
    for block in list(model)[1:-1]:
        fully_shard(block)
    fully_shard(model)
else:
    model = DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    loss = model(torch.randn(64, 128, device=device)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def real_ranks(script: Path, strategy: str, out: Path) -> Path:
    """Both ranks under torchrun with gloo on the CPU; the launch folder."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "gpu_mem_track", "run", "--device", "cpu", "--memory", "tensors"]
    command += ["--out-dir", str(out), "--run-name", f"real-{strategy}", str(script), strategy]
    subprocess.run(command, env=_env(), check=True, capture_output=True, cwd=script.parent)
    return out / f"real-{strategy}"


def simulated_rank(script: Path, strategy: str, rank: int, out: Path) -> Path:
    """One rank alone, as fit runs it; its run folder."""
    from gpu_mem_track.advisor.world import rank_environ

    env = {**rank_environ(_env(), rank, 2, 2, f"check-{strategy}"), "CUBLAS_WORKSPACE_CONFIG": ":0:0"}
    name = f"sim-{strategy}-rank{rank}"
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--simulate", GPU, "--run-to-end"]
    command += ["--census-threshold", "0", "--out-dir", str(out), "--run-name", name, str(script), strategy]
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=script.parent)
    return out / name / f"rank{rank}"


def line_events(folder: Path) -> list[tuple[tuple[int, str, int], dict[str, str]]]:
    """The timeline's line and census events, each line keyed by (line, function, nth run)."""
    seen: Counter[tuple[int, str]] = Counter()
    events = []
    with (folder / "timeline.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["event"] == "line":
                where = (int(row["line"]), row["function"])
                seen[where] += 1
                events.append(((*where, seen[where]), row))
            elif row["event"] == "census":
                events.append(((0, "census", 0), row))
    return events


def census_totals(folder: Path) -> list[dict[str, str]]:
    with (folder / "census.csv").open(newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["row"] == "totals"]


def compare(real: Path, sim: Path) -> tuple[list[dict], int]:
    """Each censused line execution of the simulated rank against the real rank after the
    same execution: (rows, census points)."""
    real_memory = {key: int(row["memory"]) for key, row in line_events(real) if key[1] != "census"}
    totals = iter(census_totals(sim))
    rows, points, last = [], 0, None
    for key, row in line_events(sim):
        if key[1] != "census":
            last = (key, row)
            continue
        total = next(totals)
        key = last[0]
        points += 1
        tensors = int(total["requested"])
        rows.append(
            {
                "line": key[0],
                "function": key[1],
                "nth": key[2],
                "real": real_memory.get(key),
                "sim_tensors": tensors,
                "sim_allocated": int(total["allocated"]),
            }
        )
    return rows, points


def source_lines(script: Path) -> list[str]:
    return script.read_text().splitlines()


def table(strategy: str, rank: int, rows: list[dict], points: int, code: list[str]) -> str:
    differ = [r for r in rows if r["real"] != r["sim_tensors"]]
    by_line: dict[tuple[int, str], list[dict]] = {}
    for r in differ:
        by_line.setdefault((r["line"], r["function"]), []).append(r)
    out = [
        f"{strategy} rank {rank}: {points - len(differ)} of {points} census points equal "
        f"(real rank's tensor bytes = simulated rank's requested bytes)",
        "",
    ]
    if not by_line:
        return "\n".join(out)
    out += [
        "| line | code | runs that differ (figures: the last) | real rank: tensor bytes "
        "| simulated: requested | simulated - real | simulated: allocated |",
        "|---|---|---|---|---|---|---|",
    ]
    for (line, _function), group in sorted(by_line.items()):
        last = group[-1]
        real = "-" if last["real"] is None else f"{last['real']:,}"
        delta = "-" if last["real"] is None else f"{last['sim_tensors'] - last['real']:+,}"
        runs = ",".join(str(r["nth"]) for r in group)
        out.append(
            f"| {line} | `{code[line - 1].strip()[:60]}` | {runs} | {real} | {last['sim_tensors']:,} "
            f"| {delta} | {last['sim_allocated']:,} |"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep the run folders in this folder")
    parser.add_argument(
        "--strategies", default="ddp,fsdp2", help="comma-separated, of ddp and fsdp2 (default: both)"
    )
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    if not set(strategies) <= {"ddp", "fsdp2"}:
        print(f"unknown strategy in {args.strategies!r}: ddp, fsdp2", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        script = out / "workload.py"
        script.write_text(textwrap.dedent(WORKLOAD).lstrip())
        code = source_lines(script)
        for strategy in strategies:
            launch = real_ranks(script, strategy, out)
            for rank in (0, 1):
                sim = simulated_rank(script, strategy, rank, out)
                rows, points = compare(launch / f"rank{rank}", sim)
                print(table(strategy, rank, rows, points, code), end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
