"""The estimator's DDP, ZeRO and FSDP2 figures against fit's simulated ranks (reports/fit_distributed.md).

One small model (a 128-wide input layer, 4 blocks of 256 -> 1024 -> 256 in a ``Sequential``
of their own, since the ``fsdp2`` lever shards a container of one class only, a 10-way head),
batch 64 per rank, 2 ranks, Adam. fit's side: a DDP script run as fit runs a trial
(``run --simulate GPU [--lever L]`` with torchrun's variables from
``advisor.world.rank_environ``, rank 0 and rank 1 each alone), as it is, with the
``zero`` lever (``ZeroRedundancyOptimizer``) and with the ``fsdp2`` lever (``fully_shard``
on each repeated block, then the root). The script takes the estimator's step
(``estimator.step``: gradients set to None, forward, the output's sum, backward, Adam)
three times and records the third step's peak allocated (``reset_peak_memory_stats``
before it). The estimator's side: ``estimate(..., world_size=2, strategy=S)`` on the same
GPU, for ddp, zero1, zero2 and fsdp (units ``blocks.[0-9]``: the 4 blocks and not the
Linears inside them, which ``blocks.*`` would also match: fnmatch's ``*`` crosses dots).

    python scripts/check/check_fit_estimate.py           # prints the markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GPU = "H100-80GB"
BATCH, WIDTH = 64, 128
MODEL = """
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(self.up(x).relu())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.head = nn.Linear(128, 256), nn.Linear(256, 10)
        self.blocks = nn.Sequential(*[Block(256) for _ in range(4)])

    def forward(self, x):
        return self.head(self.blocks(self.inp(x)))


def build():
    return Net()
"""
SCRIPT = (
    MODEL
    + """

import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("nccl")  # torch's fake group on the simulated GPU
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
model = nn.parallel.DistributedDataParallel(build().cuda(), device_ids=[local])
optimizer = torch.optim.Adam(model.parameters())
x = torch.randn(64, 128, device="cuda")
for step in range(3):
    if step == 2:
        torch.cuda.reset_peak_memory_stats()
    for p in model.parameters():
        p.grad = None
    model(x).sum().backward()
    optimizer.step()
with open(sys.argv[1] + f".rank{dist.get_rank()}.json", "w") as out:
    json.dump({"step_peak": torch.cuda.max_memory_allocated()}, out)
dist.destroy_process_group()
"""
)
#: row -> (fit's lever or None, estimator strategies and options beside it)
ROWS = {
    "DDP as it is": (None, [("ddp", {})]),
    "zero": ("zero", [("zero1", {}), ("zero2", {})]),
    "fsdp2": ("fsdp2", [("fsdp", {"fsdp_units": ("blocks.[0-9]",)})]),
}


def simulated(script: Path, lever: str | None, rank: int, out: Path) -> dict:
    """One rank as fit runs a trial: its third step's peak and the run's peak."""
    from gpu_mem_track.advisor.world import rank_environ

    env = rank_environ({**os.environ, "PYTHONPATH": str(ROOT)}, rank, 2, 2, "check")
    name = f"{lever or 'as-it-is'}-rank{rank}"
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--simulate", GPU, "--run-to-end"]
    command += ["--out-dir", str(out), "--run-name", name]
    command += ["--lever", lever] if lever else []
    command += [str(script), str(out / name)]
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=out)
    step = json.loads((out / f"{name}.rank{rank}.json").read_text())["step_peak"]
    meta = json.loads((out / name / f"rank{rank}" / "meta.json").read_text())
    return {"step_peak": step, "peak": meta["peak"], "levers": meta.get("levers")}


def estimated(strategy: str, options: dict) -> dict[int, int]:
    """Each rank's peak allocated in the estimate (ranks with the same share: once, named by
    each)."""
    from gpu_mem_track.estimator.simulate import estimate

    space: dict = {}
    exec(MODEL, space)  # the same model source as the script's
    result = estimate(
        space["build"], (BATCH, WIDTH), device="cuda", gpu=GPU, world_size=2, strategy=strategy, **options
    )
    peaks = {r.rank: r.peak for r in result.ranks}
    return {rank: peaks.get(rank, result.peak) for rank in (0, 1)}


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(
        "| fit's trial (DDP script) | rank | fit: third step's peak allocated | fit: run's peak "
        "| estimate --strategy | estimate: the rank's peak allocated | estimate - fit step |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        script = out / "train.py"
        script.write_text(SCRIPT)
        for row, (lever, strategies) in ROWS.items():
            estimates = [(s, estimated(s, o)) for s, o in strategies]
            for rank in (0, 1):
                sim = simulated(script, lever, rank, out)
                for strategy, peaks in estimates:
                    peak = peaks[rank]
                    delta = peak - sim["step_peak"]
                    print(
                        f"| {row} | {rank} | {sim['step_peak']:,} | {sim['peak']:,} | {strategy} | {peak:,} "
                        f"| {delta:+,} ({delta / sim['step_peak']:+.2%}) |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
