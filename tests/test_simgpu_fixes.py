"""Simulated-GPU engine defects found by running our own CUDA paths on it (issue 15, item
10), each checked against what a GPU does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_mem_track.simgpu import simulated_gpu


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.tensor([1.0] * 1000, device="cuda"),
        lambda: torch.as_tensor([1.0] * 1000, device="cuda"),
        lambda: torch.asarray([1.0] * 1000, device="cuda"),
        lambda: torch.asarray(np.ones(1000, dtype=np.float32), device="cuda"),
        lambda: torch.ones(1000, device="cuda").new_tensor([1.0] * 1000),
    ],
    ids=["tensor", "as_tensor", "asarray", "asarray numpy", "new_tensor"],
)
def test_a_tensor_made_from_data_on_cuda_takes_its_block(make):
    """torch makes these in C++ without an op a dispatch mode sees: they counted nothing
    (a Trainer's on-device loss accumulator held 512 B the allocator never gave)."""
    with simulated_gpu("a100-40gb"):
        t = make()
        assert torch.cuda.memory_allocated() >= 4096 and t.is_cuda
        held = torch.cuda.memory_allocated()
        del t
        assert torch.cuda.memory_allocated() == held - 4096


def test_a_tensor_from_data_keeps_its_value_dtype_and_grad_flag():
    with simulated_gpu("a100-40gb"):
        t = torch.tensor([1.0, 2.0], device="cuda", requires_grad=True)
        assert (t.tolist(), t.is_leaf, t.requires_grad, torch.cuda.memory_allocated()) == (
            [1.0, 2.0],
            True,
            True,
            512,
        )
        assert t.new_tensor([3, 4]).dtype == torch.float32  # new_tensor: the tensor's dtype
        assert torch.as_tensor([1, 2], dtype=torch.int32, device="cuda").tolist() == [1, 2]
        assert f"{torch.tensor(3.0, device='cuda') * 2:.1f}" == "6.0"


def test_an_estimate_made_on_a_simulated_gpu_is_the_estimate_made_without():
    """The face showed the estimate's meta inputs as CUDA tensors (uncounted) and the
    simulated allocator took them as well."""
    from torch import nn

    from gpu_mem_track.estimator.simulate import estimate

    def model():
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    plain = estimate(model, (16384, 64), device="cuda", gpu="ampere")
    with simulated_gpu("a100-40gb"):
        held = torch.ones(10, device="cuda")
        inside = estimate(model, (16384, 64), device="cuda", gpu="ampere")
        assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated() == 512
        assert held.is_cuda  # the simulation runs on afterwards
    assert (inside.peak, inside.reserved_peak) == (plain.peak, plain.reserved_peak)


def test_backward_hooks_see_the_gpu_and_make_tensors_on_it():
    """Backward ran with the face off (``Tensor.backward`` reaches the engine from inside
    the face's own handling): a hook saw ``meta`` devices and its ``device="cuda"``
    tensors failed (FSDP2's gathers in backward do both)."""
    with simulated_gpu("a100-40gb"):
        w = torch.ones(256, device="cuda", requires_grad=True)
        seen = []

        def hook(grad):
            seen.append(str(grad.device))
            return grad + torch.ones(256, device="cuda")

        w.register_hook(hook)
        (w * 2).sum().backward()
        assert seen == ["cuda:0"] and w.grad.is_cuda
        assert torch.cuda.memory_allocated() == 2 * 1024  # w and its gradient


def test_multihead_attention_trains_on_the_simulated_gpu():
    """``F.multi_head_attention_forward`` re-entered the face, whose own torch-function
    check handed the call back to the face: a RecursionError in every training step of
    an ``nn.MultiheadAttention`` (the examples' transformer)."""
    from torch import nn

    with simulated_gpu("a100-40gb"):
        attention = nn.MultiheadAttention(64, 4, batch_first=True).cuda()
        x = torch.randn(2, 16, 64, device="cuda")
        out, weights = attention(x, x, x)
        out.sum().backward()
        assert out.is_cuda and weights.shape == (2, 16, 16) and attention.in_proj_weight.grad.is_cuda
