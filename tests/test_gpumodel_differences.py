"""The table of CPU/meta-versus-CUDA differences names real tests, and its open case (an
einsum language model) shows no meta artefact: meta and real CPU storage timelines agree."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_mem_track.dispatch.lifetimes import Lifetimes
from gpu_mem_track.gpumodel.differences import DIFFERENCES, Difference

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("row", DIFFERENCES, ids=lambda row: row.behaviour[:40])
def test_every_difference_names_a_test_that_exists(row: Difference):
    path, _, name = row.test.partition("::")
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    assert name in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert Difference.from_dict(row.to_dict()) == row


class EinsumLM(nn.Module):
    """Bias-free einsum projections, RMS norm, a hand-written softmax attention (as the
    recorded 2.7B model's author wrote them), two layers."""

    def __init__(self, vocab: int = 500, d: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Parameter(torch.randn(vocab, d))
        self.w = nn.ParameterList(nn.Parameter(torch.randn(4, d, d) / d) for _ in range(layers))
        self.head = nn.Parameter(torch.randn(vocab, d) / d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb[ids]
        t = ids.shape[1]
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=ids.device))
        for w in self.w:
            h = x / torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True) + 1e-5)
            q, k, v = (torch.einsum("btd,ed->bte", h, w[i]) for i in range(3))
            scores = torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(~mask, float("-inf"))
            e = torch.exp(scores - scores.amax(-1, keepdim=True))
            x = x + torch.einsum(
                "btd,ed->bte", torch.einsum("bqk,bkd->bqd", e / e.sum(-1, keepdim=True), v), w[3]
            )
        return torch.einsum("btd,vd->btv", x, self.head)


def timeline(device: str) -> list[int]:
    torch.manual_seed(0)
    tracker = Lifetimes({device})
    with tracker:
        with torch.device(device):
            model = EinsumLM()
        ids = torch.randint(0, 500, (4, 32), device=device)
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
    tracker.close()
    return [tracker.sizes[key] * change for key, change in tracker.events]


def test_meta_and_cpu_storage_timelines_agree_for_an_einsum_lm():
    assert timeline("meta") == timeline("cpu")


def test_only_linear_shaped_einsums_are_run_as_linear_layers():
    from gpu_mem_track.gpumodel.einsum import as_linear

    x, w, q = torch.ones(2, 3, 4), torch.ones(5, 4), torch.ones(2, 3, 4)
    assert as_linear("...i,oi->...o", (x, w))[0] is F.linear
    assert as_linear("bsi, oi -> bso", ([x, w],))[0] is F.linear
    assert as_linear("oi,bsi->bso", (w, x)) == (F.linear, (x, w))
    assert as_linear("...i,io->...o", (x, torch.ones(4, 5)))[0] is torch.matmul
    for equation, operands in [
        ("bqd,bkd->bqk", (x, q)),  # attention scores: both operands batched
        ("a,bca->bca", (torch.ones(4), x)),  # a norm's weight: elementwise
        ("...i,oi->o...", (x, w)),  # output reordered
        ("...i,oi,o->...", (x, w, torch.ones(5))),
        ("ii,bsi->bsi", (torch.ones(4, 4), x)),
    ]:
        assert as_linear(equation, operands) is None, equation


def _backward_allocations(forward, numel: int = 1 << 20) -> int:  # noqa: ANN001
    """Blocks of ``numel`` float32 the simulated GPU allocates in ``forward(x).backward()``
    for a ``(256, numel / 256)`` leaf ``x``, from its recorded trace."""
    from gpu_mem_track.simgpu import simulated_gpu

    with simulated_gpu("h100-80gb"):
        x = torch.randn(256, numel // 256, device="cuda", requires_grad=True)
        loss = forward(x)
        torch.cuda.memory._record_memory_history(max_entries=10_000)
        loss.backward()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
    return sum(1 for e in trace if e["action"] == "alloc" and e["size"] == 4 * numel)


def test_gradient_accumulation_is_in_place_on_the_simulated_gpu_as_on_cuda():
    """``y`` feeds two products: their gradients (3g, 4g) meet in ``y``'s input buffer. CUDA
    adds 4g into 3g in place (3 blocks: 3g, 4g, then 2x the sum for ``x``, whose gradient
    is stolen); under a dispatch mode autograd adds out of place (a fourth block) unless
    gpumodel.accumulate puts the sum back in place."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return (y * 3).sum() + (y * 4).sum()

    assert _backward_allocations(forward) == 3


def test_max_and_index_backward_take_one_block_on_the_simulated_gpu_as_on_cuda():
    """CUDA's backward of ``max(dim)``, row indexing, ``gather`` and ``index_select`` makes
    zeros and scatters (index_puts, index_adds) into them: one block. Under a dispatch mode
    the formula takes its out-of-place branch (two) unless gpumodel.accumulate runs the
    in-place op."""
    rows = torch.arange(256)
    assert _backward_allocations(lambda x: x.max(dim=-1).values.sum()) == 1
    assert _backward_allocations(lambda x: x[rows.cuda(), :].sum()) == 1
    assert _backward_allocations(lambda x: x.gather(0, torch.zeros_like(x, dtype=torch.long)).sum()) == 1
    assert _backward_allocations(lambda x: x.index_select(0, rows.cuda()).sum()) == 1


def _twice(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    return (y * 3).sum() + (y * 4).sum()


def _shared(x: torch.Tensor) -> torch.Tensor:
    """``u + v``'s gradient reaches ``u``'s and ``v``'s buffers first (the same tensor in
    both): the sum into the first is out of place, into the second (alone by then) and
    into ``x``'s in place."""
    u, v = x * 2, x * 3
    p, q, s = (u * 5).sum(), (v * 7).sum(), u + v
    return p + q + s.sin().sum()


def _squared(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    return (y * y).sum()


def _atan2(x: torch.Tensor) -> torch.Tensor:
    """atan2's formula adds two temporaries out of place; x's buffer sums in place."""
    return torch.atan2(x * 2, x * 3).sum()


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x[torch.arange(8, device=x.device)].sum()


_SUMS = ("add", "scatter", "index_put", "scatter_add", "index_add", "_index_put_impl")


def _in_place_on_the_cpu(forward) -> int:  # noqa: ANN001
    """How many of the sums and scatters above real CPU autograd, with no dispatch mode,
    runs in place in ``forward(x).backward()`` (the profiler's op names)."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(16, 8, requires_grad=True)
    loss = forward(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    names = [e.name.removeprefix("aten::") for e in prof.events()]
    in_place = sum(1 for n in names if n.endswith("_") and n.rstrip("_") in _SUMS)
    return in_place - names.count("scatter_add_") * ("index_add_" in names)  # CPU's index_add_ uses it


@pytest.mark.parametrize(
    ("forward", "known_gap"),
    [(_twice, 0), (_shared, 0), (_squared, 1), (_atan2, 0), (_rows, 0)],
    ids=["twice", "shared", "squared", "atan2", "rows"],
)
def test_the_simulation_sums_in_place_where_autograd_without_a_mode_does(forward, known_gap):  # noqa: ANN001
    """The simulated GPU's in-place sums and scatters (gpumodel.accumulate's counters) are
    those real autograd makes on the CPU without a dispatch mode, the same decisions CUDA's
    input buffer makes; ``y * y`` (both gradients made by one node) is the known gap, left
    out of place (the differences table)."""
    from gpu_mem_track.simgpu import simulated_gpu

    with simulated_gpu("h100-80gb") as gpu:
        x = torch.randn(16, 8, device="cuda", requires_grad=True)
        forward(x).backward()
        done = gpu.storages.sums.summed + gpu.storages.sums.scattered
    assert done == _in_place_on_the_cpu(forward) - known_gap


def test_reference_counts_are_measured_and_a_shared_gradient_counts_one_more():
    from gpu_mem_track.gpumodel.accumulate import reference_counts

    counts = reference_counts()
    assert counts is not None and counts[0] >= 1 and counts[1] >= 1


def test_grouped_query_attention_keeps_no_repeated_key_value_copies_under_flash():
    """CUDA's flash kernel takes fewer key/value heads than query heads as they are
    (sdp_utils.cpp: supports GQA); the simulation once repeated them first, two
    query-sized copies per layer saved for backward (-1.5% of the Trainer family's peak).
    Float32 (no flash, and the efficient kernel does not take grouped heads) runs the
    math path, which repeats them."""
    from gpu_mem_track.simgpu import simulated_gpu

    def blocks(dtype: torch.dtype) -> int:
        with simulated_gpu("h100-80gb"):
            q = torch.randn(4, 16, 256, 64, device="cuda", dtype=dtype, requires_grad=True)
            k, v = (torch.randn(4, 4, 256, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in "kv")
            torch.cuda.memory._record_memory_history(max_entries=10_000)
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            trace = torch.cuda.memory._snapshot()["device_traces"][0]
            torch.cuda.memory._record_memory_history(enabled=None)
        return sum(1 for e in trace if e["action"] == "alloc" and e["size"] == q.numel() * q.element_size())

    assert blocks(torch.bfloat16) == 1  # the output only
    assert blocks(torch.float32) >= 3  # the math path's repeated key and value, and more


def test_accumulate_grad_steals_then_adds_in_place_on_the_simulated_gpu():
    """AccumulateGrad (torch/csrc/autograd/functions/accumulate_grad.h) steals a leaf's first
    gradient when nothing else holds it, and adds later ones into ``.grad`` in place: two
    backward passes of ``(x * 2).sum()`` allocate one gradient-sized block each (a clone
    forced by the simulation's own references would make a third)."""
    from gpu_mem_track.simgpu import simulated_gpu

    numel = 1 << 20
    with simulated_gpu("h100-80gb"):
        x = torch.randn(256, numel // 256, device="cuda", requires_grad=True)
        torch.cuda.memory._record_memory_history(max_entries=10_000)
        for _ in range(2):
            (x * 2).sum().backward()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
    # each pass: x * 2 in forward, its gradient in backward; the first gradient is stolen
    assert sum(1 for e in trace if e["action"] == "alloc" and e["size"] == 4 * numel) == 4
