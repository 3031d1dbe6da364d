"""Rules of the GPU model found by comparing simulated runs with the H200 nanoGPT
recordings (``../shared/fixtures/h200``, torch 2.11): each test replays the recorded
evidence on the shapes of those runs (meta tensors: no memory is used here)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_mem_track.simgpu import simulated_gpu

#: nanogpt-char: batch 64, block 256, 384 wide; its logits (64 * 256, 65).
CHAR_ACTIVATION = (64, 256, 384)
CHAR_LOGITS = (64 * 256, 65)


def allocated() -> int:
    return torch.cuda.memory_allocated()


def test_dropout_saves_a_one_byte_mask_as_cudas_fused_kernel():
    # The recording holds one 6,291,456 B block (64 * 256 * 384 bools) per nn.Dropout
    # of the training step until backward (model.py:75 and :91); the meta path held a
    # 12,582,912 B bf16 noise tensor instead.
    with simulated_gpu("h200"):
        x = torch.randn(CHAR_ACTIVATION, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        before = allocated()
        y = nn.Dropout(0.2)(x)
        assert allocated() - before == 12_582_912 + 6_291_456  # output (bf16) + mask (bool)
        assert type(y.grad_fn).__name__ == "NativeDropoutBackward0"
        y.sum().backward()
        del y
        assert allocated() - before == 12_582_912  # x.grad; the mask went with the graph


def test_dropout_that_cuda_does_not_fuse_is_unchanged():
    with simulated_gpu("h200"):
        x = torch.randn(CHAR_ACTIVATION, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        before = allocated()
        assert nn.Dropout(0.2).eval()(x) is x and F.dropout(x, 0.0, True) is x
        assert allocated() == before
        z = F.dropout(x.detach().clone(), 0.5, True, inplace=True)
        assert z.dtype == torch.bfloat16 and allocated() - before == 12_582_912  # the clone only


def test_cross_entropy_under_autocast_keeps_a_low_precision_log_softmax_and_a_float32_copy():
    # Recorded at model.py:187 in every training step: alloc 2,129,920 (bf16 log_softmax),
    # then 4,259,840 (nll_loss's float32 copy), both held until backward.
    with simulated_gpu("h200"):
        logits = torch.randn(CHAR_LOGITS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        target = torch.zeros(CHAR_LOGITS[0], dtype=torch.long, device="cuda")
        torch.cuda.memory._record_memory_history()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(logits, target, ignore_index=-1)
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
        sizes = [entry["size"] for entry in trace if entry["action"] == "alloc"]
        assert sizes[:2] == [2_129_920, 4_259_840] and loss.dtype == torch.float32
        assert not [entry for entry in trace if entry["action"] == "free_completed"]
        loss.backward()
        assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_variants_keep_their_results_under_autocast(smoothing):
    with simulated_gpu("h200"):
        logits = torch.randn(8, 5, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        probs = torch.softmax(torch.randn(8, 5, device="cuda"), 1)
        target = torch.zeros(8, dtype=torch.long, device="cuda")
        weight = torch.ones(5, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hard = F.cross_entropy(logits, target, weight, label_smoothing=smoothing, reduction="none")
            soft = F.cross_entropy(logits, probs, label_smoothing=smoothing)
            summed = F.cross_entropy(logits, target, reduction="sum", label_smoothing=smoothing)
        assert (hard.shape, soft.shape, summed.shape) == ((8,), (), ())
        assert {hard.dtype, soft.dtype, summed.dtype} == {torch.float32}


def test_out_of_memory_in_cross_entropy_asks_for_the_low_precision_block_first():
    # Under a memory fraction the H200 ran out at the loss of GPT-2 with batch 64 asking
    # for 6.14 GiB (the bf16 log_softmax of (64 * 1024, 50304) logits), not 12.28 GiB.
    with simulated_gpu("h200"):
        logits = torch.empty(64 * 1024, 50304, device="cuda", dtype=torch.bfloat16)
        target = torch.zeros(64 * 1024, dtype=torch.long, device="cuda")
        fraction = (torch.cuda.memory_reserved() + (4 << 30)) / torch.cuda.get_device_properties(
            0
        ).total_memory
        torch.cuda.set_per_process_memory_fraction(fraction)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 6\.14 GiB"):
                F.cross_entropy(logits, target)


def test_segments_are_placed_top_down_so_the_newer_of_two_equal_free_blocks_serves_first():
    # nanogpt-gpt2-bf16: with two free 2,472,542,208 B segments, the GPU put the next
    # bf16 log_softmax (1,236,271,104 B) into the one made later, at the lower address.
    logits32 = 12 * 1024 * 50304 * 4
    with simulated_gpu("h200"):
        torch.cuda.memory._record_memory_history()
        older = torch.empty(logits32, dtype=torch.uint8, device="cuda")
        newer = torch.empty(logits32, dtype=torch.uint8, device="cuda")
        del older, newer
        half = torch.empty(logits32 // 2, dtype=torch.uint8, device="cuda")
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
    older_at, newer_at = (e["addr"] for e in trace if e["action"] == "segment_alloc")
    allocs = [e["addr"] for e in trace if e["action"] == "alloc"]
    assert newer_at < older_at and allocs == [older_at, newer_at, newer_at] and half.numel() > 0


def test_autocast_lists_hold_rms_norm_interpolate_and_the_norms_as_cuda_does():
    # aten/src/ATen/autocast_mode.h: rms_norm and upsample_* on the float32 list, norms
    # with an output dtype set to float32, linalg_vecdot on the lower-precision list.
    with simulated_gpu("h200"):
        x = torch.randn(2, 3, 8, 8, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(4, 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            dtypes = [
                F.rms_norm(x, (8,)).dtype,
                F.interpolate(x, scale_factor=2.0, mode="bilinear").dtype,
                F.interpolate(x, size=(4, 4), mode="area").dtype,
                torch.norm(x).dtype,
                x.norm(dim=-1).dtype,
                torch.linalg.vecdot(v, v).dtype,
            ]
    assert dtypes == [
        torch.float32,
        torch.float32,
        torch.bfloat16,
        torch.float32,
        torch.float32,
        torch.bfloat16,
    ]


@pytest.mark.parametrize("gpu, scratch", [("h200", [256, 25_559_296]), ("a100-80gb", [])])
def test_attention_scratch_on_hopper_as_recorded(gpu, scratch):
    # nanogpt-char on the H200: a 256 B block at each attention forward and one
    # 25,559,296 B block after dq, dk, dv (12,582,912 B each) in each backward, both
    # freed at once; not modelled before sm90.
    with simulated_gpu(gpu):
        q, k, v = (
            torch.randn(64, 6, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        torch.cuda.memory._record_memory_history()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
    freed = {e["addr"]: i for i, e in enumerate(trace) if e["action"] == "free_completed"}
    allocs = [(i, e) for i, e in enumerate(trace) if e["action"] == "alloc"]
    transient = [
        e["size"] for i, e in allocs if e["size"] in (256, 25_559_296) and freed.get(e["addr"], 0) > i
    ]
    assert transient == scratch
    grads = [i for i, e in allocs if e["size"] == 12_582_912]
    assert len(grads) >= 4  # the output, dq, dk, dv
    assert all(i > grads[-1] for i, e in allocs if e["size"] == 25_559_296)
