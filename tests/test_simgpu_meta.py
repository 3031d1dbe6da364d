"""The program's own meta tensors on the simulated GPU (``simgpu.usermeta``): a model
built under ``torch.device("meta")`` counts nothing, says ``meta``, and
``to_empty(device="cuda")`` gives simulated GPU tensors, as torchtitan and PyTorch's
FSDP2 example build their models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu_mem_track.simgpu import simulated_gpu
from gpu_mem_track.simgpu.ranks import RankEnv


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))


def train(model: nn.Module) -> None:
    model(torch.randn(32, 256, device="cuda")).sum().backward()


def test_a_model_built_on_meta_and_moved_with_to_empty_costs_what_one_built_on_cuda_does():
    with simulated_gpu("a100-40gb"):
        with torch.device("meta"):
            model = build()
        assert torch.cuda.memory_allocated() == 0  # meta tensors hold no memory
        assert model[0].weight.is_meta and model[0].weight.device == torch.device("meta")
        assert not model[0].weight.is_cuda
        model.to_empty(device="cuda")
        for p in model.parameters():
            nn.init.normal_(p, std=0.02)
        assert model[0].weight.device == torch.device("cuda", 0) and not model[0].weight.is_meta
        moved = torch.cuda.memory_allocated()
        train(model)
        meta_peak = torch.cuda.max_memory_allocated()
    with simulated_gpu("a100-40gb"):
        with torch.device("cuda"):
            model = build()
        direct = torch.cuda.memory_allocated()
        train(model)
        direct_peak = torch.cuda.max_memory_allocated()
    assert moved == direct == 2 * 4 * 256 * 1024 + 4 * 1024 + 4 * 256  # each a multiple of 512 B
    assert meta_peak == direct_peak


def test_meta_tensors_count_nothing_and_cannot_be_copied_out_as_on_a_gpu():
    with simulated_gpu("a100-40gb"):
        made = [torch.empty(1 << 20, device="meta"), torch.zeros(4, 4).to("meta")]
        with torch.device("meta"):
            made.append(torch.randn(1 << 20))
        made.append(made[0] * 2)  # an op on meta tensors only: meta
        made.append(torch.empty_like(made[0]))
        assert all(t.is_meta and t.device.type == "meta" for t in made)
        assert "device='meta'" in repr(made[1])
        assert torch.cuda.memory_allocated() == 0
        with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
            made[0].to("cuda")
        with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
            made[0].cuda()
        with pytest.raises(NotImplementedError, match="to_empty"):  # nn.Module.to's hint
            nn.Linear(2, 2, device="meta").to("cuda")
        on_gpu = torch.empty_like(made[0], device="cuda")
        assert on_gpu.is_cuda and torch.cuda.memory_allocated() == 4 << 20
        simulated = torch.empty(8, device="cuda")
        assert simulated.is_cuda and not simulated.is_meta and simulated.device.type == "cuda"


def test_an_fsdp2_model_built_on_meta_shards_for_nothing_and_to_empty_gives_its_shards():
    """As rank 1 of 2: ``fully_shard`` of a meta model keeps it on meta (no memory);
    ``to_empty(device="cuda")`` makes the rank's shards, which ``reset_parameters``
    initialises (a DTensor random op); then a step, as for the model built on the GPU."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    ranks = RankEnv(rank=1, world_size=2, local_rank=1, local_world_size=2)
    figures = []
    for on_meta in (True, False):
        with simulated_gpu("a100-40gb", ranks=ranks):
            dist.init_process_group("nccl", init_method="tcp://nowhere:1")  # never reached
            try:
                with torch.device("meta" if on_meta else "cuda"):
                    model = build()
                for layer in (model[0], model[2]):
                    fully_shard(layer)
                fully_shard(model)
                sharded = torch.cuda.memory_allocated()
                if on_meta:
                    model.to_empty(device="cuda")
                    for layer in (model[0], model[2]):
                        layer.reset_parameters()
                assert model[0].weight.to_local().is_cuda
                held = torch.cuda.memory_allocated()
                train(model)
                figures.append((sharded, held, torch.cuda.max_memory_allocated()))
            finally:
                dist.destroy_process_group()
    (meta_sharded, meta_held, meta_peak), (_, direct_held, direct_peak) = figures
    assert meta_sharded == 0
    assert meta_held == direct_held == 4 * (512 * 256 + 512 + 128 * 1024 + 128)  # half of each
    assert meta_peak == direct_peak
