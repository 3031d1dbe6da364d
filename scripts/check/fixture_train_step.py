"""The training script behind the shared fixture ``transformer-2.7b-ctx128-train-step``.

Written for ``scripts/check/check_simulate.py``: our own code doing what the recording's author
ran (read from the public repositories kkaitlyn111/cs336-a2-systems, ``cs336_systems/
benchmark.py``'s memory profiling, and kkaitlyn111/cs336-assignment1, ``cs336_basics/
transformer.py``, ``optimizers.py``, ``training.py``; the fixture's stack frames name
those files and lines). It runs on a real GPU as it runs on the simulated one:

    python scripts/check/fixture_train_step.py                       # on an 80 GB GPU
    gpu-mem-track run --simulate H100-80GB scripts/check/fixture_train_step.py

What the author's session did, in one process: the 2.7B configuration (d_model 2560, 32
heads, d_ff 10240, 32 layers, vocabulary 10,000, RoPE theta 10,000, context 128-512,
batch 4, float32, ``set_float32_matmul_precision('high')``), one run per (forward only?,
context): build the model and a fresh AdamW, start recording the allocator's history,
reset the peak, ``empty_cache()``, then a forward pass, or a full step (gradients set to
None, forward, cross-entropy, backward, AdamW step), then read
``max_memory_allocated()`` and dump the snapshot. The runs were forward-only at contexts
128, 256 and 512, then full steps; the fixture is the first full step (context 128),
and this script stops after it (``--runs`` gives more). The runs before it matter:
their freed blocks are the cache the recorded step's model was built in.

The operations are the author's, in their order (they decide the memory): bias-free
linear layers as ``einsum`` over an ``(out, in)`` weight, RMSNorm through
``vector_norm``, SwiGLU as ``sigmoid(t1) * t1 * t3``, RoPE on interleaved pairs written
into a ``zeros_like`` buffer, attention with an explicit boolean causal mask and a
hand-written softmax, cross-entropy with max subtraction and ``log-sum-exp`` by hand,
and a hand-written AdamW (state made at the first step; ``sqrt`` and a division make
two parameter-sized temporaries per parameter). One difference, with no effect on the
GPU: the author's linear layers made their weights on the CPU and ``model.to(device)``
copied them over; here they are made on the device. Either way the GPU's large pool sees
the same requests in the same order (the embedding's weight, then each layer's
q, k, v, output, w1, w2, w3, then the LM head: ``Module.to`` visits children in order),
and this skips 13.6 GB of host memory and its random initialisation per model.
"""

from __future__ import annotations

import argparse
import math
import os
from contextlib import nullcontext

import torch
from torch import nn

D_MODEL, HEADS, D_FF, LAYERS, VOCAB, THETA, BATCH = 2560, 32, 10240, 32, 10_000, 10_000.0, 4
#: The author's session up to and including the recorded run: (forward only, context).
RECORDED_SESSION = ((True, 128), (True, 256), (True, 512), (False, 128))


class Linear(nn.Module):
    """``y = x W^T`` by einsum; ``W`` is ``(out_dim, in_dim)``, truncated-normal."""

    def __init__(self, out_dim: int, in_dim: int, device=None, dtype=None):
        super().__init__()
        std = math.sqrt(2 / (out_dim + in_dim))
        weight = torch.zeros(out_dim, in_dim, device=device, dtype=dtype)
        self.weight = nn.Parameter(nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return torch.einsum("oi,...i->...o", self.weight, x)


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, dim, device=device, dtype=torch.float32))

    def forward(self, tokens):
        return self.weight[tokens]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, device=None):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=torch.float32))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        scale = torch.sqrt(norm**2 / self.dim + self.eps)
        normed = x / scale
        out = torch.einsum("d,bsd->bsd", self.weight, normed)
        return out.to(dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(hidden, dim, device, dtype)
        self.w2 = Linear(dim, hidden, device, dtype)
        self.w3 = Linear(hidden, dim, device, dtype)

    def forward(self, x):
        gate = self.w1(x)
        up = self.w3(x)
        silu = torch.sigmoid(gate) * gate
        return self.w2(silu * up)


class Rotary(nn.Module):
    """RoPE on interleaved pairs; a ``(positions, pairs, 2)`` cos/sin table as a buffer."""

    def __init__(self, theta: float, head_dim: int, max_len: int, device=None):
        super().__init__()
        self.pairs = head_dim // 2
        positions = torch.arange(max_len, device=device)
        even = torch.arange(0, head_dim, 2, device=device)
        inverse = 1.0 / (theta ** (even.float() / head_dim))
        angles = torch.outer(positions, inverse)
        table = torch.zeros(max_len, head_dim // 2, 2, device=device)
        table[:, :, 0] = torch.cos(angles)
        table[:, :, 1] = torch.sin(angles)
        self.register_buffer("table", table, persistent=False)

    def forward(self, x, positions):
        pairs = x.reshape(*x.shape[:-1], self.pairs, 2)
        cos = self.table[positions, :, 0].unsqueeze(1)
        sin = self.table[positions, :, 1].unsqueeze(1)
        out = torch.zeros_like(pairs)
        out[..., 0] = cos * pairs[..., 0] - sin * pairs[..., 1]
        out[..., 1] = sin * pairs[..., 0] + cos * pairs[..., 1]
        return out.reshape(x.shape)


def softmax(x, dim: int):
    largest = torch.max(x, dim=dim, keepdim=True)[0]
    shifted = torch.exp(x - largest)
    total = torch.sum(shifted, dim=dim, keepdim=True)
    return shifted / total


def attention(q, k, v, mask):
    scores = torch.einsum("...qd,...kd->...qk", q, k)
    scores = scores / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask == False, -1e9)  # noqa: E712 (the author's comparison)
    return torch.einsum("...qk,...kd->...qd", softmax(scores, dim=-1), v)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int, theta: float, device=None, dtype=None):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = Linear(dim, dim, device, dtype), Linear(dim, dim, device, dtype)
        self.v_proj, self.output_proj = Linear(dim, dim, device, dtype), Linear(dim, dim, device, dtype)
        self.rope = Rotary(theta, dim // heads, max_len, device)

    def _heads(self, x):
        batch, seq, _ = x.shape
        return x.reshape(batch, seq, self.heads, -1).permute(0, 2, 1, 3)

    def forward(self, x):
        batch, seq, _ = x.shape
        q_flat, k_flat, v_flat = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = self._heads(q_flat), self._heads(k_flat), self._heads(v_flat)
        positions = torch.arange(seq, device=x.device).unsqueeze(0).expand(batch, -1)
        q = self.rope(q, positions)
        k = self.rope(k, positions)
        mask = torch.triu(torch.ones(seq, seq, device=x.device), diagonal=1).to(torch.bool)
        mask = ~mask
        mask = mask.unsqueeze(0).unsqueeze(0).expand(batch, self.heads, -1, -1)
        out = attention(q, k, v, mask)
        out = out.permute(0, 2, 1, 3).reshape(batch, seq, -1)
        return self.output_proj(out)


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, max_len, theta, device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(dim, device=device)
        self.attn = SelfAttention(dim, heads, max_len, theta, device, dtype)
        self.ln2 = RMSNorm(dim, device=device)
        self.ffn = SwiGLU(dim, hidden, device, dtype)

    def forward(self, x):
        h = self.ln1(x)  # h is kept until the next assignment, as the author's code did
        h = self.attn(h)
        x = x + h
        h = self.ln2(x)
        h = self.ffn(h)
        return x + h


class TransformerLM(nn.Module):
    def __init__(self, context: int, device=None, dtype=None):
        super().__init__()
        self.token_embeddings = Embedding(VOCAB, D_MODEL, device)
        self.layers = nn.ModuleList(
            Block(D_MODEL, HEADS, D_FF, context, THETA, device, dtype) for _ in range(LAYERS)
        )
        self.ln_final = RMSNorm(D_MODEL, device=device)
        self.lm_head = Linear(VOCAB, D_MODEL, device, dtype)

    def forward(self, tokens):
        x = self.token_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.ln_final(x)
        return self.lm_head(x)


class AdamW(torch.optim.Optimizer):
    """AdamW written out; its state appears at the first step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def step(self, closure=None):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.data
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p.data)
                    state["exp_avg_sq"] = torch.zeros_like(p.data)
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.data.addcdiv_(m, denom, value=-lr / (1 - beta1**t))
                if decay:
                    p.data.add_(p.data, alpha=-lr * decay)


def cross_entropy(logits, targets):
    logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    largest = torch.max(logits, dim=-1, keepdim=True).values
    logits = logits - largest
    exps = torch.exp(logits)
    sum_exp = exps.sum(dim=-1)
    rows = torch.arange(logits.shape[0])  # on the CPU, as the author's was
    picked = logits[rows, targets]
    losses = torch.log(sum_exp) - picked
    return losses.mean()


def profile_run(forward_only: bool, context: int, snapshots: str, device) -> int:
    """One of the author's runs; returns ``max_memory_allocated()`` (bytes)."""
    model = TransformerLM(context, device=device, dtype=torch.float32)
    model.to(device)
    optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-8, betas=(0.9, 0.95))
    batch = torch.randint(0, VOCAB, (BATCH, context)).to(device)
    with nullcontext():  # the author's autocast slot: float32 here
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        if forward_only:
            logits = model(batch)  # kept (with its graph) until the run ends, as the author's was
        else:
            optimizer.zero_grad()
            logits = model(batch)
            loss = cross_entropy(logits, batch)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device)
    name = f"memory_ctx{context}_{'forward' if forward_only else 'fullstep'}_.pickle"
    os.makedirs(snapshots, exist_ok=True)
    torch.cuda.memory._dump_snapshot(os.path.join(snapshots, name))
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"context {context} {'forward' if forward_only else 'full step'}: max_memory_allocated {peak} B")
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--snapshots", default="memory_files", help="folder for the dumped snapshots")
    parser.add_argument(
        "--runs",
        type=int,
        default=len(RECORDED_SESSION),
        help="runs of the session (default: up to the recorded one)",
    )
    args = parser.parse_args()
    torch.set_float32_matmul_precision("high")
    device = torch.device("cuda")
    session = RECORDED_SESSION + ((False, 256), (False, 512))
    for forward_only, context in session[: args.runs]:
        profile_run(forward_only, context, args.snapshots, device)


if __name__ == "__main__":
    main()
