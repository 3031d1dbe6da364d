"""Rank 0 of an N-way FSDP2 and DDP script: on one real GPU in torch's fake process group,
against the simulated rank 0 (``run --simulate GPU`` with torchrun's variables, as
``fit --nproc-per-node`` runs it). Passes when the simulated peak allocated is within
0.5% and the peak reserved within 1% of the GPU's.

    python scripts/gpu/gpu_check_ranks.py                 # on a machine with a CUDA GPU
    python scripts/gpu/gpu_check_ranks.py --dry           # here: both sides on the CPU wheel,
                                                          # the real side on the CPU (no figures)

The real side runs the workload in this process with ``RANK=0``: ``init_process_group``
gets backend ``fake`` (torch's ``FakeStore``); DDP's buckets go through a hook that returns
them unchanged (the fake group leaves the all-reduce's result empty), as the simulated
rank does. NCCL is not used on either side, so its own memory is in neither figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = """
import os, sys, json
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

STRATEGY, WORLD, OUT = sys.argv[1], int(os.environ["WORLD_SIZE"]), sys.argv[2]
if not dist.is_initialized():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=int(os.environ["RANK"]), world_size=WORLD)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


model = nn.Sequential(nn.Linear(512, 1024), *[Block(1024) for _ in range(6)], nn.Linear(1024, 10))
if STRATEGY == "fsdp2":
    for block in list(model)[1:-1]:
        fully_shard(block)
    fully_shard(model)
    model = model.cuda()
else:
    model = DistributedDataParallel(model.cuda())
    try:  # the simulated rank registers the same pass-through hook itself
        def passed_on(state, bucket):
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done
        model.register_comm_hook(None, passed_on)
    except RuntimeError:
        pass
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    model(torch.randn(256, 512, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
if OUT != "-":
    with open(OUT, "w") as f:
        peaks = {"peak": torch.cuda.max_memory_allocated(), "reserved_peak": torch.cuda.max_memory_reserved()}
        json.dump(peaks, f)
"""


def rank_env(world: int) -> dict[str, str]:
    return {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "PYTHONPATH": str(ROOT),
    }


def simulated(script: Path, strategy: str, world: int, gpu: str, out: Path) -> dict[str, int]:
    name = f"{strategy}-w{world}"
    command = [
        sys.executable,
        "-m",
        "gpu_mem_track",
        "run",
        "--simulate",
        gpu,
        "--run-to-end",
        "--out-dir",
        str(out),
        "--run-name",
        name,
        str(script),
        strategy,
        "-",
    ]
    subprocess.run(command, env=rank_env(world), check=True, capture_output=True)
    meta = json.loads((out / name / "rank0" / "meta.json").read_text())
    return {"peak": meta["peak"], "reserved_peak": meta["reserved_peak"]}


def real(script: Path, strategy: str, world: int, out: Path, dry: bool) -> dict[str, int] | None:
    if dry:  # the workload runs (fake process group, hooks) on the simulated GPU; no figures
        return None
    target = out / f"real-{strategy}-w{world}.json"
    subprocess.run([sys.executable, str(script), strategy, str(target)], env=rank_env(world), check=True)
    return json.loads(target.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="no GPU: run the simulated side only")
    parser.add_argument("--gpu", default="H100-80GB", help="the simulated GPU (the real one's name)")
    parser.add_argument("--world-sizes", default="2,4,8", help="N of each N-way run, comma-separated")
    args = parser.parse_args()
    if not args.dry:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA GPU: use --dry", file=sys.stderr)
            return 2
        args.gpu = torch.cuda.get_device_name(0) if args.gpu == "auto" else args.gpu
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        out, script = Path(tmp), Path(tmp) / "workload.py"
        script.write_text(textwrap.dedent(WORKLOAD).lstrip())
        for world in (int(w) for w in args.world_sizes.split(",")):
            for strategy in ("fsdp2", "ddp"):
                sim = simulated(script, strategy, world, args.gpu, out)
                got = real(script, strategy, world, out, args.dry)
                if got is None:
                    print(
                        f"{strategy} rank 0 of {world}: simulated {sim['peak']:,} allocated, "
                        f"{sim['reserved_peak']:,} reserved (dry)"
                    )
                    continue
                a = abs(sim["peak"] - got["peak"]) / got["peak"]
                r = abs(sim["reserved_peak"] - got["reserved_peak"]) / got["reserved_peak"]
                ok = a <= 0.005 and r <= 0.01
                failed += not ok
                print(
                    f"{strategy} rank 0 of {world}: allocated {sim['peak']:,} vs {got['peak']:,} ({a:.3%}), "
                    f"reserved {sim['reserved_peak']:,} vs {got['reserved_peak']:,} ({r:.3%}): "
                    f"{'ok' if ok else 'FAIL'}"
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
