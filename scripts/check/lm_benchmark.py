"""A cs336-style Transformer language-model benchmark loop: forward and backward only.

The family issue 27 measured (+2.3% simulated over the GPU before gpumodel.accumulate): a
pre-norm decoder written from tensor ops as course assignments write it (bias-free
einsum linears, an embedding looked up by indexing its weight, RMSNorm, RoPE, a
hand-written causal softmax attention, SwiGLU, a cross-entropy through ``max`` and
``logsumexp``), float32, no optimizer, and gradients accumulating across iterations
(no ``zero_grad``). Random token ids, no data files. Prints the peaks at the end::

    python scripts/check/lm_benchmark.py [--d-model 768 --layers 12 ...]
    python -m gpu_mem_track run --simulate h200 scripts/check/lm_benchmark.py

Needs a CUDA device (or the simulated one); ``--device cpu`` runs it on the CPU.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from torch import nn


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        self.weight = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(vocab, d_model), a=-3, b=3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(dtype)


class RoPE(nn.Module):
    def __init__(self, theta: float, d_k: int, max_len: int) -> None:
        super().__init__()
        freqs = theta ** (-torch.arange(0, d_k, 2).float() / d_k)
        angles = torch.outer(torch.arange(max_len).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions], self.sin[positions]
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("...qk,...kd->...qd", softmax(scores, -1), v)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, rope: RoPE) -> None:
        super().__init__()
        self.heads = heads
        self.rope = rope
        self.ln1, self.ln2 = RMSNorm(d_model), RMSNorm(d_model)
        self.q, self.k, self.v, self.o = (Linear(d_model, d_model) for _ in range(4))
        self.w1, self.w3 = Linear(d_model, d_ff), Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        positions = torch.arange(t, device=x.device)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q = self.rope(split(self.q(h)), positions)
        k = self.rope(split(self.k(h)), positions)
        y = attention(q, k, split(self.v(h)), mask).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(y)
        h = self.ln2(x)
        a = self.w1(h)
        return x + self.w2(a * torch.sigmoid(a) * self.w3(h))


class LM(nn.Module):
    def __init__(self, vocab: int, context: int, d_model: int, layers: int, heads: int, d_ff: int) -> None:
        super().__init__()
        rope = RoPE(10000.0, d_model // heads, context)
        self.embed = Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_ff, rope) for _ in range(layers))
        self.norm = RMSNorm(d_model)
        self.head = Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    log_z = torch.log(torch.exp(shifted).sum(dim=-1))
    picked = shifted.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (log_z - picked).mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=10000, help="vocabulary size")
    parser.add_argument("--context", type=int, default=256, help="sequence length")
    parser.add_argument("--d-model", type=int, default=768, help="model width")
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=12, help="attention heads")
    parser.add_argument("--d-ff", type=int, default=3072, help="feed-forward width")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--device", default="cuda", help="device to run on")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = LM(args.vocab, args.context, args.d_model, args.layers, args.heads, args.d_ff).to(device)
    ids = torch.randint(0, args.vocab, (args.batch, args.context), device=device)
    targets = torch.randint(0, args.vocab, (args.batch, args.context), device=device)
    for _ in range(args.warmup + args.steps):
        loss = cross_entropy(model(ids), targets)
        loss.backward()  # gradients accumulate: the benchmark never zeroes them
        if device.type == "cuda":
            torch.cuda.synchronize()
    if device.type == "cuda":
        print(f"max_memory_allocated {torch.cuda.max_memory_allocated()}")
        print(f"max_memory_reserved {torch.cuda.max_memory_reserved()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
