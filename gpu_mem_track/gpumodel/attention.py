"""The ``scaled_dot_product_attention`` backend CUDA picks, run on meta tensors.

On meta (and CPU) tensors ``F.scaled_dot_product_attention`` runs the math path, which
keeps a sequence x sequence attention matrix (and its softmax) for backward. On CUDA,
PyTorch picks a fused kernel when it can (``sdp_utils.cpp``), in this order:

- flash attention: compute capability 8.0+, float16/bfloat16, no ``attn_mask``,
  4-d inputs with one head dimension <= 256 that is a multiple of 8; it saves the
  output and a float32 log-sum-exp of (batch, heads, query length);
- memory-efficient attention: capability 5.0+, float32/float16/bfloat16, an
  ``attn_mask`` allowed, head dimension a multiple of 8 (4 for float32); it saves the
  output and a float32 log-sum-exp of (batch, heads, query length rounded up to 32);
- else the math path.

A backend disabled by ``torch.backends.cuda.enable_*_sdp(False)`` or left out of
``torch.nn.attention.sdpa_kernel`` is skipped. Where flash would run on compute
capability 9.0 and later with a head dimension of at most 128, PyTorch prefers cuDNN's
attention (``check_prefer_cudnn_attention``): it takes its random seed and offset, one
int64 each (8 B), before the output and the float32 log-sum-exp of (batch, heads, query
length, 1), and keeps all four for backward (every attention forward of the H200
recordings ``timm-vit-b16-bf16`` and ``nanogpt-*``: 8, 8, output, log-sum-exp, where
flash's meta kernel gave the output, the log-sum-exp, then 16 B and 8 B);
:func:`pick_backend` says ``"cudnn"`` there, and the simulated GPU registers the seed and
offset first (``simgpu.engine``). With ``enable_gqa`` and fewer key/value heads than
query heads, flash (and cuDNN) run on the grouped heads as they are (no repeated copies:
sdp_utils.cpp's ``check_batch_size_and_num_heads_dense<true /*supports GQA*/>``; their
backward's expanded key/value gradients, summed inside the kernel, are not modelled); the
memory-efficient kernel does not take them, so the math path runs (it repeats them
itself). Dropout's random state is a few bytes.

Kernel scratch (:func:`kernel_scratch`): on compute capability 9.0 and later, where
PyTorch prefers cuDNN's attention for half precision (``check_prefer_cudnn_attention``
in ``sdp_utils.cpp``), the H200 recordings (torch 2.11, ``../shared/fixtures/h200``)
show a 256 B workspace taken and freed at each attention forward, and one block of
``4 * B * H * T * (D + 1) + 256`` bytes (a float32 query-gradient accumulator and a
float32 row sum) taken after the three input gradients and freed at once in each
attention backward: 25,559,296 B for nanogpt-char (B 64, H 6, T 256, D 64),
38,338,816 B for nanogpt-gpt2-bf16 (B 12, H 12, T 1024, D 64). On older GPUs the flash
kernel's scratch is not modelled.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["CUDNN_FORWARD", "cuda_attention", "kernel_scratch", "pick_backend"]

_HALF = (torch.float16, torch.bfloat16)


def pick_backend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, has_mask: bool, capability: tuple[int, int]
) -> str:
    """``"cudnn"``, ``"flash"``, ``"efficient"`` or ``"math"``: the backend CUDA would run."""
    shaped = query.dim() == 4 and key.dim() == 4 and value.dim() == 4
    head = query.shape[-1]
    same = key.shape[-1] == head and value.shape[-1] == head and query.dtype == key.dtype == value.dtype
    if (
        shaped
        and same
        and torch.backends.cuda.flash_sdp_enabled()
        and capability >= (8, 0)
        and query.dtype in _HALF
        and not has_mask
        and head <= 256
        and head % 8 == 0
    ):
        prefer_cudnn = capability >= (9, 0) and head <= 128 and torch.backends.cuda.cudnn_sdp_enabled()
        return "cudnn" if prefer_cudnn else "flash"
    align = 4 if query.dtype == torch.float32 else 8
    if (
        shaped
        and same
        and torch.backends.cuda.mem_efficient_sdp_enabled()
        and capability >= (5, 0)
        and query.dtype in (torch.float32, *_HALF)
        and head % align == 0
    ):
        return "efficient"
    return "math"


def cuda_attention(func: Any, args: tuple, kwargs: dict, capability: tuple[int, int]) -> Any:
    """``F.scaled_dot_product_attention(*args, **kwargs)`` (``func``) as CUDA would run it."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    given = dict(zip(names, args))
    given.update(kwargs)
    query, key, value = given["query"], given["key"], given["value"]
    mask = given.get("attn_mask")
    grouped = given.get("enable_gqa") and query.dim() == 4 and key.shape[-3] != query.shape[-3]
    backend = pick_backend(query, key, value, mask is not None, capability)
    if grouped and backend == "efficient":
        backend = "math"  # sdp_utils.cpp: only flash (and cuDNN) take grouped key/value heads
    dropout, causal, scale = given.get("dropout_p", 0.0), given.get("is_causal", False), given.get("scale")
    if backend == "cudnn":
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            query, key, value, None, grad, dropout, causal, False, scale=scale
        )[0]
    if backend == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout, causal, False, scale=scale
        )[0]
    if backend == "efficient":
        bias = _bias(mask, query, key)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, grad, dropout, causal, scale=scale
        )[0]
    return func(*args, **kwargs)


#: Scratch bytes a fused attention forward takes and frees on sm90+ (recorded).
FORWARD_SCRATCH = 256
_FORWARDS = (
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
)
_BACKWARDS = (
    torch.ops.aten._scaled_dot_product_flash_attention_backward.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default,
)
#: cuDNN attention's forward, whose seed and offset (outputs 6 and 7) CUDA allocates first.
CUDNN_FORWARD = _FORWARDS[1]


def kernel_scratch(func: Any, args: tuple, capability: tuple[int, int]) -> int:
    """Bytes the aten op ``func`` takes and frees at once on a GPU of ``capability``
    beyond its outputs (0: none modelled); see the module doc."""
    if func not in _FORWARDS and func not in _BACKWARDS or capability < (9, 0):
        return 0
    if func in _FORWARDS:
        return FORWARD_SCRATCH
    if len(args) > 1 and args[1].dim() == 4:
        batch, heads, length, head = args[1].shape
        return 4 * batch * heads * length * (head + 1) + 256
    return 0


def _bias(mask: Any, query: torch.Tensor, key: torch.Tensor) -> Any:
    """A boolean mask as the additive float bias the efficient kernel takes, broadcast
    to (batch, heads, query length, key length) as PyTorch does before the call."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill(~mask, -math.inf)
    shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return mask.expand(shape)
