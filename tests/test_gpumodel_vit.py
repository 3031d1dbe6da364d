"""Rules of the GPU model found by comparing a simulated ViT-B/16 training step with the H200
recording ``timm-vit-b16-bf16`` (``../shared/fixtures/h200``, torch 2.11, batch 64: 12,608
tokens of 768): each test replays the recorded evidence on the shapes of that run (meta
tensors: no memory is used here)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_mem_track.gpumodel.reduce import (
    LT_WORKSPACE,
    Staging,
    lt_workspace_bytes,
    staging_bytes,
    threads_per_multiprocessor,
)
from gpu_mem_track.simgpu import simulated_gpu

TOKENS = 64 * 197
H200 = (132, 2048)  # SMs, threads per SM


@pytest.mark.parametrize(
    "shape, reduced, staging",
    [
        ((TOKENS, 768), (0,), Staging(77_463_552, 24)),  # fc2's and proj's bias gradients
        ((TOKENS, 2304), (0,), Staging(139_198_464, 72)),  # qkv's
        ((TOKENS, 3072), (0,), Staging(138_412_032, 96)),  # fc1's
        ((64, 197, 768), (0, 1), Staging(77_463_552, 24)),  # the same sum before flattening
        ((64, 1000), (0,), Staging(0, 0)),  # the head's: 64 rows, one block each
        ((TOKENS, 768), (1,), Staging(0, 0)),  # along the fastest dimension: not modelled
    ],
)
def test_reduction_staging_sizes_as_recorded(shape, reduced, staging):
    assert staging_bytes(shape, reduced, True, *H200) == staging


def test_reduction_staging_needs_a_contiguous_input_and_a_known_gpu():
    assert staging_bytes((TOKENS, 768), (0,), False, *H200) == Staging(0, 0)
    assert staging_bytes((TOKENS, 768), (0,), True, 0, 2048) == Staging(0, 0)
    # fewer SMs: fewer blocks per output, a smaller buffer (A100: 108 SMs)
    assert staging_bytes((TOKENS, 768), (0,), True, 108, 2048).buffer == 4 * 768 * 197 * 128


def trace_of(step) -> list[dict]:
    torch.cuda.memory._record_memory_history()
    try:
        step()
        return torch.cuda.memory._snapshot()["device_traces"][0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def transient(trace: list[dict], index: int) -> bool:
    """Whether the block allocated at ``index`` was freed later in ``trace``."""
    addr = trace[index]["addr"]
    return any(e["action"] == "free_completed" and e["addr"] == addr for e in trace[index + 1 :])


def test_bias_gradient_in_backward_takes_a_float32_result_and_the_staging_first():
    # Recorded in each block's fc2 backward (a steady step, entries 533-541): alloc 3,072
    # (float32 sum), 77,463,552 and 24 (staging), both freed, alloc 1,536 (the bf16
    # bias gradient), free 3,072. The simulation had the 1,536 B block alone.
    with simulated_gpu("h200"):
        fc2 = nn.Linear(3072, 768).to("cuda")
        hidden = torch.randn(64, 197, 3072, device="cuda", dtype=torch.bfloat16, requires_grad=True)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = fc2(hidden)
            out.backward(torch.ones_like(out))

        trace = trace_of(step)
    allocs = [(i, e["size"]) for i, e in enumerate(trace) if e["action"] == "alloc"]
    sizes = [size for _, size in allocs]
    start = sizes.index(3072)
    assert sizes[start : start + 4] == [3072, 77_463_552, 24, 1536]
    assert all(transient(trace, i) for i, _ in allocs[start : start + 3])


def test_sum_in_forward_takes_the_staging_after_its_output():
    with simulated_gpu("h200"):
        x = torch.randn(TOKENS, 768, device="cuda", dtype=torch.bfloat16)
        trace = trace_of(lambda: x.sum(0))
    sizes = [e["size"] for e in trace if e["action"] == "alloc"]
    assert sizes == [1536, 77_463_552, 24]


def test_addmm_with_a_bias_takes_cublaslt_workspace_once_per_handle():
    # timm-vit-b16-bf16 entry 207: after the first qkv linear's output and the 32 MiB cuBLAS
    # workspace, one 1,048,576 B block, held to the end (timm-resnet50-amp's head: the same).
    with simulated_gpu("h200"):
        x = torch.randn(TOKENS, 768, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2304, 768, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(2304, device="cuda", dtype=torch.bfloat16)
        out = 2 * TOKENS * 2304
        trace = trace_of(lambda: [x @ w.t(), F.linear(x, w, b), F.linear(x, w, b)])
        kept = [e["size"] for i, e in enumerate(trace) if e["action"] == "alloc" and not transient(trace, i)]
    sizes = [e["size"] for e in trace if e["action"] == "alloc"]
    # the matmul without bias takes cuBLAS's workspace only; the first with one, cuBLASLt's too
    assert sizes == [out, 32 * 2**20, out, LT_WORKSPACE, out]
    assert kept == [32 * 2**20, LT_WORKSPACE]


def test_cublaslt_workspace_size_follows_its_variable():
    assert lt_workspace_bytes({}) == 1_048_576
    assert lt_workspace_bytes({"CUBLASLT_WORKSPACE_SIZE": "4096"}) == 4 * 2**20
    assert lt_workspace_bytes({"CUBLASLT_WORKSPACE_SIZE": "lots"}) == 1_048_576


def test_attention_on_hopper_takes_cudnns_seed_and_offset_before_its_output():
    # Every attention forward of the recording (attention.py:124): alloc 8, 8 (cuDNN's
    # seed and offset), 19,365,888 (output), 605,184 (float32 log-sum-exp), 256 (scratch,
    # freed); the first three and the log-sum-exp kept for backward. Flash's meta kernel
    # gave the output and log-sum-exp first, then 16 B and 8 B.
    with simulated_gpu("h200"):
        q, k, v = (
            torch.randn(64, 12, 197, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        trace = trace_of(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    allocs = [(i, e["size"]) for i, e in enumerate(trace) if e["action"] == "alloc"]
    assert [size for _, size in allocs[:5]] == [8, 8, 19_365_888, 605_184, 256]
    assert [transient(trace, i) for i, _ in allocs[:5]] == [True, True, True, True, True]
    assert sum(1 for _, size in allocs if size == 39_337_216) == 1  # the backward's scratch


def test_attention_before_hopper_stays_flash():
    with simulated_gpu("a100-80gb"):
        q, k, v = (torch.randn(64, 12, 197, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        trace = trace_of(lambda: F.scaled_dot_product_attention(q, k, v))
    sizes = [e["size"] for e in trace if e["action"] == "alloc"]
    assert sizes[:2] == [19_365_888, 605_184] and 256 not in sizes


@pytest.mark.parametrize("rows, dtype", [(64, torch.bfloat16), (128, torch.float16)])
def test_head_bias_gradient_takes_a_float32_result_without_staging(rows, dtype):
    # The ViT's head (64 rows, bf16) and timm-resnet50-amp's (128 rows, fp16): alloc 4,000
    # (float32 sum), 2,000 (the bias gradient), free 4,000; too few rows to split.
    with simulated_gpu("h200"):
        head = nn.Linear(768, 1000).to("cuda")
        features = torch.randn(rows, 768, device="cuda", dtype=dtype, requires_grad=True)

        def step():
            with torch.autocast("cuda", dtype=dtype):
                out = head(features)
            out.backward(torch.ones_like(out))

        trace = trace_of(step)
    allocs = [(i, e["size"]) for i, e in enumerate(trace) if e["action"] == "alloc"]
    sizes = [size for _, size in allocs]
    start = sizes.index(4000)
    assert sizes[start : start + 2] == [4000, 2000] and transient(trace, allocs[start][0])


def test_a_sum_splits_by_the_threads_an_sm_holds():
    """``setReduceConfig`` aims at SMs x (``maxThreadsPerMultiProcessor`` / threads per
    block) blocks: 1,536 threads on sm86 and sm89, 1,024 on sm75, 2,048 on sm70, sm80 and
    sm90 (CUDA's per-capability table). Fewer resident threads, fewer blocks per output,
    a smaller staging buffer: the ViT's 768-wide bias gradient on 80 SMs."""
    assert [threads_per_multiprocessor(c) for c in ((7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0))] == [
        2048,
        1024,
        2048,
        1536,
        1536,
        2048,
    ]
    # 32 x 4 threads a block, 6 blocks across the outputs: a target of 80 x 16, 12 or 8
    # blocks per SM gives 197 (the most 3,152 rows a thread allow at 16 each), 160 and 107
    # blocks per output; 4 B x 768 outputs x 32 x 4 each
    sizes = [staging_bytes((TOKENS, 768), (0,), True, 80, threads).buffer for threads in (2048, 1536, 1024)]
    assert sizes == [4 * 768 * 128 * ctas for ctas in (197, 160, 107)]
