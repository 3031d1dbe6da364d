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


def test_gradient_accumulation_is_out_of_place_on_the_simulated_gpu():
    """``y`` feeds two products: their gradients (3g, 4g) meet in ``y``'s input buffer. CUDA
    adds 4g into 3g in place (3 blocks: 3g, 4g, then 2x the sum for ``x``); under the
    simulation's dispatch mode autograd adds out of place: a fourth block (the
    differences table's row; a fix turns this 4 into 3)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return (y * 3).sum() + (y * 4).sum()

    assert _backward_allocations(forward) == 4


def test_max_and_index_backward_take_a_second_block_on_the_simulated_gpu():
    """CUDA's backward of ``max(dim)`` and of row indexing makes zeros and scatters (or
    index_puts) into them: one block. Under a dispatch mode the formula takes its
    out-of-place branch: two (the differences table's row)."""
    rows = torch.arange(256)
    assert _backward_allocations(lambda x: x.max(dim=-1).values.sum()) == 2
    assert _backward_allocations(lambda x: x[rows.cuda(), :].sum()) == 2
