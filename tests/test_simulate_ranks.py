"""Ranks on simulated GPUs under ``torchrun`` (``run --simulate``): each rank runs its own
simulated GPU, the process group is torch's fake one, and DDP's buckets and FSDP2's
gathered parameters and buffers take the rank's memory as on the GPU. Each rank's peak
is checked against ``estimate --strategy`` of the same model, batch and step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu_mem_track.runfolder.files import read_meta
from gpu_mem_track.simgpu import simulated_gpu
from gpu_mem_track.simgpu.ranks import RankEnv

ROOT = Path(__file__).resolve().parents[1]

#: The estimator's step (estimator.step.run_steps): gradients set to None, forward, the
#: output's sum as the loss, backward, Adam; the third step measured.
SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("nccl")  # a fake group on the simulated GPUs
local = int(__import__("os").environ["LOCAL_RANK"])
torch.cuda.set_device(local)
layers = [nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 1024)]
model = nn.Sequential(*layers).to(f"cuda:{local}")
if sys.argv[1] == "fsdp":
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
else:
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
optimizer = torch.optim.Adam(model.parameters())
x = torch.randn(64, 1024, device="cuda")
for step in range(3):
    if step == 2:
        torch.cuda.reset_peak_memory_stats()
    for p in model.parameters():
        p.grad = None
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
peak = torch.cuda.max_memory_allocated()
sys.stdout.write(f"rank {dist.get_rank()} of {dist.get_world_size()} on {x.device}: {peak}\\n")
dist.destroy_process_group()
"""


def model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 1024)
    )


def estimated(strategy: str) -> int:
    from gpu_mem_track.estimator.simulate import estimate

    return estimate(model, (64, 1024), device="cuda", gpu="ampere", world_size=2, strategy=strategy).peak


def torchrun(tmp_path: Path, strategy: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "gpu_mem_track", "run", "--simulate", "a100-40gb", "--run-to-end"]
    command += ["--out-dir", str(tmp_path / "reports"), str(script), strategy]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


#: How far a rank's simulated peak may be from the estimate: DDP is modelled by the
#: estimator bucket for bucket (one 512-byte block apart: the script's loss); FSDP2's
#: gather and reduce-scatter buffers are modelled more coarsely.
TOLERANCE = {"ddp": 0.0001, "fsdp": 0.01}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_rank_runs_on_its_own_simulated_gpu_as_the_estimate_says(tmp_path, strategy):
    done = torchrun(tmp_path, strategy)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = dict(re.findall(r"rank (\d) of 2 on cuda:\1: (\d+)", done.stdout))
    assert sorted(printed) == ["0", "1"], done.stdout
    expected = estimated(strategy)
    (launch,) = (tmp_path / "reports").iterdir()
    for rank in (0, 1):
        peak = int(printed[str(rank)])
        assert abs(peak - expected) <= TOLERANCE[strategy] * expected, (rank, peak, expected)
        meta = read_meta(launch / f"rank{rank}" / "meta.json")
        assert (meta.rank, meta.world_size, meta.exit_code) == (rank, 2, 0)
        assert meta.simulation is not None and meta.simulation.gpu["name"] == "A100-40GB"
        assert meta.peak >= peak  # the run's own peak covers the measured step


def test_ddp_buckets_and_fsdp2_shards_take_the_ranks_memory():
    """In one process, as rank 1 of 2: DDP allocates a bucket as large as the gradients;
    FSDP2 keeps half of each parameter, and the step completes (no data moves)."""
    ranks = RankEnv(rank=1, world_size=2, local_rank=1, local_world_size=2)
    with simulated_gpu("a100-40gb", ranks=ranks):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl", init_method="tcp://nowhere:1")  # never reached
        assert (dist.get_rank(), dist.get_world_size(), torch.cuda.current_device()) == (1, 2, 1)
        layer = nn.Linear(1024, 1024).cuda()
        params = torch.cuda.memory_allocated()
        ddp = nn.parallel.DistributedDataParallel(layer)
        assert torch.cuda.memory_allocated() == 2 * params  # the bucket
        ddp(torch.randn(8, 1024, device="cuda")).sum().backward()
        assert layer.weight.grad.is_cuda and layer.weight.grad.device == torch.device("cuda", 1)
        del ddp, layer
        sharded = nn.Linear(1024, 1024).cuda()
        before = torch.cuda.memory_allocated()
        fully_shard(sharded)
        assert torch.cuda.memory_allocated() == before - params // 2
        sharded(torch.randn(8, 1024, device="cuda")).sum().backward()
        assert sharded.weight.grad.to_local().shape == (512, 1024)
        dist.destroy_process_group()
    assert not dist.is_initialized()


def test_the_census_of_an_fsdp2_rank_counts_the_memory_the_rank_holds():
    """As rank 1 of 2: each parameter a DTensor (global shape) over its local shard; the
    census counts the shards once, as parameters, so its total is the simulated GPU's
    allocated memory (before, each DTensor counted again at its full size)."""
    from gpu_mem_track.tracker.census import take_census

    ranks = RankEnv(rank=1, world_size=2, local_rank=1, local_world_size=2)
    with simulated_gpu("a100-40gb", ranks=ranks):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl", init_method="tcp://nowhere:1")  # never reached
        try:
            model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 8)).cuda()
            fully_shard(model)
            params = list(model.parameters())
            objects = [*params, *(p.to_local() for p in params)]
            census = take_census("cuda:1", objects.copy, [("model", model)])
            allocated = torch.cuda.memory_allocated()
            del model, params, objects
        finally:
            dist.destroy_process_group()
    assert census.bytes_by_kind()["Parameter"] == census.nbytes == allocated
    assert allocated == 4 * (512 * 1024 + 512 + 4 * 1024) + 512  # half of each; the bias's 16 B block
