"""The distributed estimator: hand-computed figures for a 2-layer MLP under each strategy.

The MLP is Linear(8, 4), ReLU, Linear(4, 2): weights 4x8 and 2x4, biases 4 and 2, so
46 float32 elements, 184 B. CPU target (exact sizes), Adam with foreach off: per
parameter exp_avg and exp_avg_sq of its size, and a 4 B float32 ``step``.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gpu_mem_track import estimate, find_max_batch_size
from gpu_mem_track.dispatch.lifetimes import Lifetimes
from gpu_mem_track.dispatch.memory import ExactMemory
from gpu_mem_track.errors import UsageError
from gpu_mem_track.estimator.distributed import bucket_sizes
from gpu_mem_track.estimator.options import DistOptions
from gpu_mem_track.estimator.plan import fsdp_units, zero_partition
from gpu_mem_track.estimator.render import render_estimate

PARAM_BYTES = 184
INPUT = (3, 8)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))


def est(world_size: int = 1, **options):
    return estimate(mlp, INPUT, device="cpu", world_size=world_size, **options)


def test_one_rank():
    single = est()
    # DDP on one rank still has its bucket; ZeRO-2 owns everything and has none
    assert est(1, strategy="ddp").peak == est(1, strategy="zero1").peak == single.peak + PARAM_BYTES
    assert est(1, strategy="zero2").peak == single.peak
    assert est(1, strategy="ddp").ranks == ()
    # FSDP on one rank: the shard is the whole parameter
    assert est(1, strategy="fsdp").parameter_bytes == PARAM_BYTES


@pytest.mark.parametrize("world_size", [1, 2])
def test_fsdp_layer_table_shows_the_shards_and_the_title_the_strategy(world_size):
    fsdp = est(world_size, strategy="fsdp")
    layers = {layer.name: layer for layer in fsdp.layers}
    # this rank's shard of each layer: dim 0 split over the ranks, padded to equal rows
    assert layers["0"].parameters == (8 * 4 + 4) // world_size
    assert sum(layer.parameter_bytes for layer in fsdp.layers) == fsdp.parameter_bytes > 0
    if world_size == 1:
        assert fsdp.parameter_bytes == PARAM_BYTES
    title = render_estimate(fsdp).splitlines()[0]
    assert ("fsdp on 1 rank" if world_size == 1 else "rank 0 of 2, fsdp") in title


def test_estimate_command_fsdp_without_world_size_says_fsdp(in_process):
    result = in_process("estimate", "tests.test_estimate_dist:mlp", "--input", "3x8", "--device", "cpu",
                        "--strategy", "fsdp")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "(fsdp on 1 rank)" in result.stdout.splitlines()[0]
    assert "0        Linear            36          144 B" in result.stdout


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_adds_its_buckets_to_every_moment(world_size):
    single, ddp = est(), est(world_size, strategy="ddp")
    assert ddp.peak == single.peak + PARAM_BYTES  # one bucket: 46 elements < 1 MiB
    assert [p.peak for p in ddp.phases] == [p.peak + PARAM_BYTES for p in single.phases]
    assert ddp.at_peak.gradient == single.at_peak.gradient + PARAM_BYTES
    assert [r.peak for r in ddp.ranks] == [ddp.peak] * world_size


def test_ddp_gradient_as_bucket_view_keeps_gradients_in_the_bucket():
    view = est(2, strategy="ddp", gradient_as_bucket_view=True)
    assert view.gradient_bytes == PARAM_BYTES  # the gradients are the bucket itself
    # after backward only the bucket holds gradients: the single step's gradient bytes again
    assert view.phases[0].peak == est().phases[0].peak


def test_bucket_sizes_follow_ddp_caps():
    params = [
        torch.empty(1_000_000, device="meta"),
        torch.empty(10, device="meta"),
        torch.empty(300_000, device="meta"),
    ]
    # reversed: 300,000 floats (1.2 MB) close the 1 MiB first bucket; the rest stay under 25 MiB
    assert bucket_sizes(params, None) == [(300_000, torch.float32), (1_000_010, torch.float32)]
    assert bucket_sizes(params, 0.5) == [(300_000, torch.float32), (1_000_010, torch.float32)]
    assert bucket_sizes(params, 100) == [(1_300_010, torch.float32)]
    half = [torch.empty(4, device="meta", dtype=torch.float16), torch.empty(3, device="meta")]
    assert bucket_sizes(half, None) == [(3, torch.float32), (4, torch.float16)]


def test_bucket_sizes_match_torch_assignment():
    dist = pytest.importorskip("torch.distributed")
    params = [torch.empty(n, device="meta") for n in (1_000_000, 10, 300_000, 5, 7_000_000)]
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20]
    backward = params[::-1]  # the order gradients become ready
    indices, _ = dist._compute_bucket_assignment_by_size(backward, limits)
    theirs = sorted(sum(backward[i].numel() for i in bucket) for bucket in indices)
    assert sorted(n for n, _ in bucket_sizes(params, None)) == theirs


def test_zero_partition_is_greedy_by_size():
    assert zero_partition([100, 50, 50, 10], 2) == [0, 1, 1, 0]
    # the MLP: 4x8 weight (32) to rank 0; 2x4 weight (8), 4 bias, 2 bias to rank 1
    assert zero_partition([32, 4, 8, 2], 2) == [0, 1, 1, 1]
    assert zero_partition([32, 4, 8, 2], 4) == [0, 2, 1, 3]


@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_shards_the_optimizer_state(world_size):
    zero1 = est(world_size, strategy="zero1")
    # rank 0 owns the 4x8 weight: exp_avg and exp_avg_sq of 128 B and one 4 B step
    assert zero1.optimizer_state_bytes == 2 * 128 + 4
    assert zero1.rank == 0 and zero1.peak == max(r.peak for r in zero1.ranks)
    assert len(zero1.ranks) == world_size
    assert zero1.at_peak.gradient >= PARAM_BYTES  # DDP's bucket is still there


def test_zero2_keeps_only_owned_gradients():
    zero2 = est(2, strategy="zero2")
    assert zero2.gradient_bytes == 128  # rank 0's 4x8 weight
    assert zero2.optimizer_state_bytes == 2 * 128 + 4
    assert zero2.peak < est(2, strategy="zero1").peak


def test_fsdp_shards_with_dim0_padding():
    two, four = est(2, strategy="fsdp"), est(4, strategy="fsdp")
    # 2 ranks: 2 of 4 rows (16 + 2 elements), 1 of 2 rows (4 + 1): 23 floats
    assert two.parameter_bytes == 23 * 4
    assert two.gradient_bytes == 23 * 4  # each unit's reduce-scatter output, padded
    assert two.optimizer_state_bytes == 2 * 23 * 4 + 4 * 4
    # 4 ranks: 1 row each (8 + 1), the 2-row weight padded to 1 row (4 + 1): 14 floats
    assert four.parameter_bytes == 14 * 4
    # rank 0 holds a real row of every parameter; ranks 2 and 3 none of the second layer
    assert four.optimizer_state_bytes == 2 * 14 * 4 + 4 * 4
    peaks = [r.peak for r in four.ranks]
    assert peaks[0] == peaks[1] > peaks[2] == peaks[3]
    assert four.peak < two.peak < est().peak


def test_fsdp_reshard_after_forward_false_keeps_parameters():
    keep = est(2, strategy="fsdp", reshard_after_forward=False)
    assert keep.peak >= est(2, strategy="fsdp").peak


def test_fsdp_units_default_and_patterns():
    model = mlp()
    assert [name for name, _ in fsdp_units(model, ())] == ["0", "2", ""]
    assert [name for name, _ in fsdp_units(model, ("2",))] == ["2", ""]
    with pytest.raises(UsageError, match="no module matches"):
        fsdp_units(model, ("nothing*",))


def test_resized_storage_is_a_death_and_a_birth():
    tracker = Lifetimes({"meta"}, ExactMemory())
    with tracker:
        tensor = torch.empty(10, device="meta")
    assert tracker.live == 40
    tensor.untyped_storage().resize_(0)
    tracker.resized(tensor)
    assert tracker.live == 0
    tensor.untyped_storage().resize_(40)
    tracker.resized(tensor)
    assert (tracker.live, tracker.peak) == (40, 40)
    del tensor
    assert tracker.live == 0


@pytest.mark.parametrize(
    "given, message",
    [
        (dict(world_size=0), "at least 1"),
        (dict(world_size="two"), "whole number"),
        (dict(world_size=2, strategy="tp"), "unknown strategy"),
        (dict(bucket_cap_mb=0), "positive"),
    ],
)
def test_bad_distributed_options(given, message):
    with pytest.raises(UsageError, match=message):
        DistOptions.parse(**given)


def test_strategy_defaults_to_ddp_past_one_rank():
    assert DistOptions.parse(world_size=2).strategy == "ddp"
    assert DistOptions.parse().strategy == "none"


def test_estimate_command_per_rank(in_process):
    factory = "tests.test_estimate_dist:mlp"
    result = in_process("estimate", factory, "--input", "3x8", "--device", "cpu", "--world-size", "4",
                        "--strategy", "fsdp", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert data["parameter_bytes"] == 14 * 4
    text = in_process("estimate", factory, "--input", "3x8", "--device", "cpu", "--world-size", "2")
    assert "rank 0 of 2, ddp" in text.stdout and "per rank: 0:" in text.stdout


def test_estimate_command_rejects_a_bad_strategy(in_process):
    result = in_process("estimate", "tests.test_estimate_dist:mlp", "--input", "3x8", "--strategy", "tp")
    assert result.returncode == 2
    assert "unknown strategy 'tp'" in result.stderr


@pytest.mark.slow
def test_batch_size_is_per_rank(in_process):
    args = [
        "batch-size",
        "tests.test_estimate_dist:mlp",
        "--input",
        "1x8",
        "--device",
        "cpu",
        "--budget",
        "64KiB",
    ]
    single = in_process(*args, "--json")
    sharded = in_process(*args, "--json", "--world-size", "4", "--strategy", "fsdp")
    assert single.returncode == sharded.returncode == 0, sharded.stderr
    assert json.loads(sharded.stdout)["batch"] >= json.loads(single.stdout)["batch"]
    assert "fsdp over 4 ranks" in json.loads(sharded.stdout)["source"]
    measured = in_process(*args, "--measure", "--world-size", "2")
    assert measured.returncode == 2 and "estimated only" in measured.stderr


def test_cuda_target_ranks_go_through_the_allocator_model():
    cuda = dict(device="cuda", alloc_conf="", cublas_workspace=0)
    single = estimate(mlp, INPUT, **cuda)
    ddp = estimate(mlp, INPUT, world_size=2, strategy="ddp", **cuda)
    # the 184 B bucket is one 512 B block of the caching allocator, at every moment
    assert [p.peak for p in ddp.phases] == [p.peak + 512 for p in single.phases]
    assert ddp.reserved_peak is not None and ddp.reserved_peak >= ddp.peak
    assert ddp.fragmentation == ddp.reserved_at_peak - ddp.peak
    fsdp = estimate(mlp, INPUT, world_size=4, strategy="fsdp", **cuda)
    assert fsdp.rounding == "CUDA caching allocator (default settings)"
    assert fsdp.parameter_bytes == 4 * 512  # each rank's 4 shards, one block each
    assert fsdp.peak == max(r.peak for r in fsdp.ranks) and fsdp.reserved_peak >= fsdp.peak
    text = render_estimate(fsdp)
    assert "rank 0 of 4, fsdp" in text and "per rank: 0:" in text and "reserved peak" in text


def test_resized_storage_goes_back_to_the_caching_allocator():
    from gpu_mem_track.estimator.target import target_spec
    from gpu_mem_track.simgpu.engine import GpuMemory

    tracker = Lifetimes({"meta"}, GpuMemory(target_spec()))
    with tracker:
        tensor = torch.empty(10, device="meta")
    assert (tracker.live, tracker.memory.allocator.allocated) == (512, 512)
    tensor.untyped_storage().resize_(0)
    tracker.resized(tensor)
    assert (tracker.live, tracker.memory.allocator.allocated) == (0, 0)
    tensor.untyped_storage().resize_(40)
    tracker.resized(tensor)
    assert (tracker.live, tracker.memory.allocator.allocated) == (512, 512)
    del tensor
    assert (tracker.live, tracker.memory.allocator.allocated) == (0, 0)


def own_step(model, optimizer, inputs):
    model(*inputs).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_custom_step_with_a_strategy_is_refused():
    with pytest.raises(UsageError, match="custom step .* --strategy ddp over 2 ranks"):
        est(2, step=own_step)
    with pytest.raises(UsageError, match="custom step .* --strategy fsdp"):
        find_max_batch_size(
            mlp, INPUT, budget=1 << 20, device="cpu", model_step=own_step,
            distributed=DistOptions.parse(world_size=2, strategy="fsdp"),
        )  # fmt: skip
    with pytest.raises(UsageError, match="custom step .* --strategy ddp over 1 rank:"):
        est(1, strategy="ddp", step=own_step)  # its bucket would be left out
    # one process is still a plain custom step
    assert est(1, step=own_step).step.endswith(":own_step")


def test_estimate_command_refuses_step_with_a_strategy(in_process):
    result = in_process("estimate", "tests.test_estimate_dist:mlp", "--input", "3x8", "--device", "cpu",
                        "--world-size", "2", "--step", "tests.test_estimate_dist:own_step")  # fmt: skip
    assert result.returncode == 2
    assert "custom step" in result.stderr and "Traceback" not in result.stderr
