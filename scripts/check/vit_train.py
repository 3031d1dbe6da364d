"""A ViT-B/16 bf16-autocast training loop in plain torch, as timm's ``benchmark.py --model
vit_base_patch16_224 --bench train --amp --amp-dtype bfloat16 -b 64`` runs it (the H200
recording ``timm-vit-b16-bf16``).

The layers are timm's ``VisionTransformer`` (``timm/models/vision_transformer.py`` and
``timm/layers``, huggingface/pytorch-image-models aa4b5850) with its defaults for
``vit_base_patch16_224``: ``PatchEmbed`` (a 16x16 stride-16 convolution with bias, then
``flatten(2).transpose(1, 2)``), a class token concatenated before the learned position
embedding is added (``_pos_embed``, a method as in timm, so the patch embedding's output
lives until it returns), pre-norm ``Block``s (``LayerNorm`` eps 1e-6,
``Attention`` with a biased ``qkv`` linear whose output is reshaped to (3, B, heads, N,
head_dim) and unbound, ``F.scaled_dot_product_attention``, ``transpose(1, 2).reshape``,
``proj``; ``Mlp``: ``fc1``, exact GELU, ``fc2``), a final ``LayerNorm``, the class token
pooled (``x[:, 0]``) and a 1000-class head. Dropouts have rate 0 (timm's defaults). The
modules and parameters are registered in timm's order, so ``.to("cuda")`` allocates them
in the same order.

The step is timm's ``TrainBenchmarkRunner._step``: ``zero_grad()``, forward and loss
under ``torch.autocast("cuda", torch.bfloat16)``, ``backward()`` inside it, then SGD
(``create_optimizer_v2(opt="sgd", lr=1e-4)``: one parameter group, momentum 0.9,
Nesterov, no weight decay), with ``cudnn.benchmark`` and TF32 matmuls on (set at the top
of timm's ``benchmark.py``), ``torch.cuda.empty_cache()`` before the model is made
(``_try_run``), the input ``torch.randn`` made after the optimizer: 3 warm-up and 5 timed
steps, each ended by ``torch.cuda.synchronize()``. Prints ``max_memory_allocated`` and
``max_memory_reserved`` at the end.

    python scripts/check/vit_train.py [--batch 64] [--depth 12] [--size 224] [--steps 8]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """timm's ``Attention`` with fused attention (``F.scaled_dot_product_attention``)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.norm = nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.norm(x)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    """timm's ``Mlp``: ``fc1``, GELU, ``fc2`` (dropouts of rate 0)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(0.0)
        self.norm = nn.Identity()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class Block(nn.Module):
    """timm's pre-norm transformer ``Block`` (no layer scale, no drop path)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.ls1 = nn.Identity()
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, dim * 4)
        self.ls2 = nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PatchEmbed(nn.Module):
    """timm's ``PatchEmbed``: a patch-sized, patch-strided convolution, flattened to tokens."""

    def __init__(self, patch: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, patch, bias=True)
        self.norm = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class VisionTransformer(nn.Module):
    """timm's ``vit_base_patch16_224`` (86,567,656 parameters at depth 12, size 224)."""

    def __init__(self, size: int = 224, depth: int = 12, dim: int = 768, heads: int = 12, patch: int = 16):
        super().__init__()
        self.patch_embed = PatchEmbed(patch, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        self.pos_drop = nn.Dropout(0.0)
        self.patch_drop = nn.Identity()
        self.norm_pre = nn.Identity()
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc_norm = nn.Identity()
        self.head_drop = nn.Dropout(0.0)
        self.head = nn.Linear(dim, 1000)

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos_embed
        return self.pos_drop(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = self._pos_embed(x)  # the patch embedding's output lives until this returns
        x = self.norm_pre(self.patch_drop(x))
        x = self.blocks(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, 0]  # global_pool 'token'
        return self.head(self.head_drop(self.fc_norm(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        return self.forward_head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="images per step (default 64)")
    parser.add_argument("--depth", type=int, default=12, help="transformer blocks (default 12)")
    parser.add_argument("--size", type=int, default=224, help="image height and width (default 224)")
    parser.add_argument("--steps", type=int, default=8, help="training steps (default 8: 3 warm-up, 5 timed)")
    args = parser.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.cuda.empty_cache()
    model = VisionTransformer(args.size, args.depth).to("cuda")
    model.train()
    loss_fn = nn.CrossEntropyLoss().to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True)
    inputs = torch.randn(args.batch, 3, args.size, args.size, device="cuda")
    for _ in range(args.steps):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            output = model(inputs)
            target = torch.empty(output.shape[0], device="cuda", dtype=torch.long).random_(1000)
            loss_fn(output, target).backward()
        optimizer.step()
        torch.cuda.synchronize()
    print(f"max_memory_allocated {torch.cuda.max_memory_allocated()} B")
    print(f"max_memory_reserved {torch.cuda.max_memory_reserved()} B")


if __name__ == "__main__":
    main()
