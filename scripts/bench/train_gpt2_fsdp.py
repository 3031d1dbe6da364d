"""A GPT-2 124M-sized model trained with FSDP2 under torchrun (fit's speed workload).

GPT-2 small's shape (12 layers, 12 heads, 768 wide, 1024 tokens, a 50,304-token
vocabulary, the head tied to the embedding), built and initialised on the CPU,
``fully_shard`` on each block and then on the model, then moved to the GPU (each rank
moves its shards only); AdamW, made-up tokens, ``sys.argv[1]`` sequences per GPU
(default 8), ``sys.argv[2]`` steps (default 5).

    torchrun --nproc-per-node 8 scripts/bench/train_gpt2_fsdp.py 8
    gpu-mem-track fit --nproc-per-node 8 RTX-4090 scripts/bench/train_gpt2_fsdp.py 8
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

LAYERS, HEADS, WIDTH, CONTEXT, VOCAB = 12, 12, 768, 1024, 50304


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = (
            t.view(batch, tokens, HEADS, WIDTH // HEADS).transpose(1, 2) for t in self.qkv(x).split(WIDTH, 2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, tokens, WIDTH))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(WIDTH), Attention()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def initialise(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            module.reset_parameters()


def main() -> None:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    model = GPT()
    initialise(model)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    for step in range(steps):
        idx = torch.randint(VOCAB, (batch, CONTEXT), device=device)
        loss = model(idx, torch.roll(idx, -1, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
