"""The distributed levers (``run --simulate --lever``) on rank 0 of 4 simulated ranks:
each applies where it should (FSDP2 saving what the same script sharded by hand saves)
and says why where it does not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_levers_runs import NET

from gpu_mem_track.levers import read_levers
from gpu_mem_track.levers.sharding import communication
from gpu_mem_track.runfolder.files import read_meta
from gpu_mem_track.runfolder.records import RunInfo

GPU = "2GiB:sm80"
ROOT = Path(__file__).resolve().parents[1]

MODEL = (
    """
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
"""
    + NET.rstrip()
    + "\n"
)

LOOP = """
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    out = model(torch.randn(512, 256, device="cuda"))
    out.sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""

SINGLE = MODEL + "model = Net().cuda()\n" + LOOP
DDP = MODEL + 'dist.init_process_group("nccl")\nmodel = DistributedDataParallel(Net().cuda())\n' + LOOP
BY_HAND = (
    MODEL
    + """
dist.init_process_group("nccl")
model = Net()
for block in model.h:
    fully_shard(block)
fully_shard(model)
model = model.cuda()
"""
    + LOOP
)
SHARDS_ITSELF = BY_HAND
FLAT = (
    MODEL.replace("for block in self.h:\n            x = block(x)", "")
    + "model = Net().embed.cuda()\n"
    + LOOP
)


@pytest.fixture
def rank0(monkeypatch):
    """Rank 0 of 4 as torchrun starts it; the fake process group ended after the test."""
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(key, value)
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def simulate(tmp_path: Path, source: str, name: str, *levers: str) -> tuple[RunInfo, list]:
    """``run --simulate`` of ``source`` as rank 0 (``rank0``'s variables), in a process of
    its own: FSDP2 and DDP keep a script's model reachable after it ends (its classes and
    hooks), which would stay in this process's later censuses."""
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source).lstrip())
    out = tmp_path / "reports"
    options = [token for lever in levers for token in ("--lever", lever)]
    argv = [
        "run",
        "--simulate",
        GPU,
        "--run-to-end",
        "--out-dir",
        str(out),
        "--run-name",
        name,
        *options,
        str(script),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *argv], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    folder = out / name / "rank0"
    return read_meta(folder / "meta.json"), read_levers(folder)


def test_fsdp2_on_a_single_gpu_script_saves_what_sharding_by_hand_saves(tmp_path, rank0):
    base, _ = simulate(tmp_path, SINGLE, "base")
    lever, [report] = simulate(tmp_path, SINGLE, "fsdp2", "fsdp2")
    hand, _ = simulate(tmp_path, BY_HAND, "hand")
    assert report.applied and report.reason == ""
    assert report.detail.startswith("4 x Block in h + the root Net, over 4 ranks")
    assert "the script starts no process group: the lever started it" in report.detail
    assert (
        report.change
        == "dist.init_process_group('nccl'); for block in model.h: fully_shard(block); fully_shard(model)"
    )
    assert report.where.endswith("fsdp2.py:30")
    assert "all-gather of the parameters twice" in report.cost
    assert (lever.peak, lever.reserved_peak) == (hand.peak, hand.reserved_peak)
    assert lever.peak < base.peak


def test_fsdp2_replaces_the_ddp_wrap(tmp_path, rank0):
    ddp, _ = simulate(tmp_path, DDP, "ddp")
    lever, [report] = simulate(tmp_path, DDP, "ddpfsdp", "fsdp2")
    assert report.applied
    assert report.change.startswith(
        "for block in model.h: fully_shard(block); fully_shard(model) (instead of the DDP wrap at ddpfsdp.py:"
    )
    assert "init_process_group" not in report.change  # the script starts its own
    assert lever.peak < ddp.peak


def test_fsdp2_shards_the_blocks_of_a_sequential_that_also_holds_its_head(tmp_path, rank0):
    source = (
        MODEL
        + "blocks = (Block(256) for _ in range(3))\n"
        + "model = nn.Sequential(nn.Linear(256, 256), *blocks, nn.Linear(256, 10)).cuda()\n"
    )
    lever, [report] = simulate(tmp_path, source + LOOP, "mixed", "fsdp2")
    base, _ = simulate(tmp_path, source + LOOP, "mixedbase")
    assert report.applied and report.detail.startswith("3 x Block in Sequential + the root Sequential")
    assert report.change.endswith("for block in model[1:4]: fully_shard(block); fully_shard(model)")
    assert lever.peak < base.peak


def test_fsdp2_shards_the_layers_of_an_mlp_among_its_activations(tmp_path, rank0):
    source = MODEL + (
        "model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), "
        "nn.Linear(1024, 256)).cuda()\n"
    )
    lever, [report] = simulate(tmp_path, source + LOOP, "mlp", "fsdp2")
    base, _ = simulate(tmp_path, source + LOOP, "mlpbase")
    assert report.applied and report.detail.startswith("3 x Linear in Sequential + the root Sequential")
    assert report.change.endswith(
        "for block in (b for b in model if isinstance(b, torch.nn.Linear)): fully_shard(block); "
        "fully_shard(model)"
    )
    assert lever.peak < base.peak


CONVNET = """
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

layers = [m for c in (3, 16, 16) for m in (nn.Conv2d(c, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())]
model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(16 * 8 * 8, 10))
"""
CONVNET_LOOP = """
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    model(torch.randn(4, 3, 8, 8, device="cuda")).sum().backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    ("shard", "levers"),
    [
        ("model = model.cuda()\n", ("fsdp2",)),  # the lever shards at the move
        ('dist.init_process_group("nccl")\nfully_shard(model)\nmodel = model.cuda()\n', ()),
    ],
)
def test_fsdp2_moves_batchnorms_integer_buffer_to_the_simulated_gpu(tmp_path, rank0, shard, levers):
    # BatchNorm's num_batches_tracked stays a real CPU tensor in the simulation (an integer
    # under virtual.THRESHOLD); FSDP2's `tensor.data = tensor.to(device)` refused it
    info, reports = simulate(tmp_path, CONVNET + shard + CONVNET_LOOP, "convnet", *levers)
    assert info.exit_code == 0
    assert all(report.applied for report in reports)


@pytest.mark.parametrize("levers", [("checkpoint",), ("fsdp2", "checkpoint")])
def test_a_lever_names_the_model_inside_the_ddp_wrap(tmp_path, rank0, levers):
    mlp = "nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))"
    source = MODEL + f'dist.init_process_group("nccl")\nmodel = DistributedDataParallel({mlp}.cuda())\n'
    _, reports = simulate(tmp_path, source + LOOP, "wrapped", *levers)
    report = next(r for r in reports if r.name == "checkpoint")
    # not DistributedDataParallel, nor the wrapper the fsdp2 lever puts in its place
    assert report.reason.startswith("Sequential has no ModuleList/Sequential")


ACCELERATE = (
    MODEL
    + """
from accelerate import Accelerator

accelerator = Accelerator()
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(2):
    accelerator.backward(model(torch.randn(64, 256, device=accelerator.device)).sum())
    optimizer.step()
    optimizer.zero_grad()
"""
)


def test_the_sharding_levers_leave_an_accelerate_script_to_its_own_config(tmp_path, rank0):
    pytest.importorskip("accelerate")
    # Before, fsdp2 sharded at prepare's .to() and Accelerate's DDP wrap refused the DTensors;
    # zero's optimizer failed in AcceleratedOptimizer (its state dict before a consolidation)
    info, reports = simulate(tmp_path, ACCELERATE, "hf_accelerate", "fsdp2", "zero")
    why = {report.name: report.reason for report in reports if not report.applied}
    assert why["fsdp2"].startswith("the model is moved by Hugging Face Accelerate's prepare")
    assert "--fsdp_version 2" in why["fsdp2"]
    assert why["zero"].startswith("an Accelerator exists")
    assert info.exit_code == 0


def test_zero_shards_a_ddp_scripts_optimizer_state(tmp_path, rank0):
    ddp, _ = simulate(tmp_path, DDP, "ddp")
    lever, [report] = simulate(tmp_path, DDP, "zero", "zero")
    assert report.applied, report.reason
    assert report.detail.startswith("AdamW as ZeroRedundancyOptimizer over 4 ranks")
    assert (
        report.change == "optimizer = ZeroRedundancyOptimizer(model.parameters(), lr=1e-3, "
        "optimizer_class=torch.optim.AdamW)"
    )
    assert lever.peak < ddp.peak


@pytest.mark.parametrize(
    ("source", "levers", "name", "why"),
    [
        (SINGLE, ("zero",), "zero", "the optimizer is built outside a process group"),
        (
            DDP,
            ("fsdp2", "zero"),
            "zero",
            "the model is sharded with FSDP2: its optimizer's state is sharded already",
        ),
        (SHARDS_ITSELF, ("fsdp2",), "fsdp2", "the script shards with fully_shard itself"),
        (FLAT, ("fsdp2",), "fsdp2", "no module with repeated blocks or layers was moved to the GPU"),
        (SINGLE, ("no-reshard",), "no-reshard", "nothing calls fully_shard"),
        (SINGLE, ("fsdp2-bf16",), "fsdp2-bf16", "nothing calls fully_shard"),
        (SINGLE, ("cpu-offload",), "cpu-offload", "nothing calls fully_shard"),
    ],
)
def test_a_distributed_lever_that_cannot_apply_says_why(tmp_path, rank0, source, levers, name, why):
    _, reports = simulate(tmp_path, source, "why", *levers)
    report = next(r for r in reports if r.name == name)
    assert not report.applied
    assert report.reason.startswith(why)


@pytest.mark.parametrize(
    ("option", "keyword", "lower"),
    [
        ("no-reshard", "reshard_after_forward=False", False),
        ("fsdp2-bf16", "mp_policy=", True),
        ("cpu-offload", "offload_policy=", True),
    ],
)
def test_fsdp2s_options_apply_with_it_and_to_a_script_that_shards_itself(
    tmp_path, rank0, option, keyword, lower
):
    alone, _ = simulate(tmp_path, SINGLE, "fsdp2", "fsdp2")
    both, reports = simulate(tmp_path, SINGLE, "both", "fsdp2", option)
    fsdp2, opt = reports
    assert fsdp2.applied and opt.applied
    assert keyword in fsdp2.change  # the one line to write holds the option
    assert opt.cost == ""  # counted in fsdp2's
    assert (both.peak < alone.peak) if lower else (both.peak > alone.peak)
    assert opt.changes_results == (option == "fsdp2-bf16")
    if option == "cpu-offload":  # the script's own .cuda() after sharding cannot move offloaded shards
        return
    own, [report] = simulate(tmp_path, SHARDS_ITSELF, "own", option)
    assert report.applied and keyword in report.change and report.cost
    assert report.changes_results == opt.changes_results


def test_communication_bytes_follow_the_ring_collectives():
    p = 400_000_000
    assert communication("ddp", p, 4)[1] == 2 * 3 * p // 4
    assert communication("zero", p, 4)[1] == 3 * 3 * p // 4
    assert communication("fsdp2", p, 4)[1] == 3 * 3 * p // 4  # two all-gathers + one reduce-scatter
    assert communication("fsdp2", p, 4, frozenset({"no-reshard"}))[1] == 2 * 3 * p // 4
    assert communication("fsdp2", p, 4, frozenset({"fsdp2-bf16"}))[1] == 3 * (p + p) // 4
    assert communication("ddp", p, 1)[1] == 0
    assert "all-reduce of the gradients" in communication("ddp", p, 4)[0]
