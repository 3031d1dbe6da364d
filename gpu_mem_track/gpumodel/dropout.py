"""Dropout as CUDA runs it: one fused kernel whose mask is a bool tensor.

``at::dropout`` (``aten/src/ATen/native/Dropout.cpp``) takes the fused path,
``at::native_dropout``, when ``is_fused_kernel_acceptable``: the input is a CUDA tensor,
``0 < p < 1`` and it has elements. That kernel returns the output and a ``bool`` mask
(one byte per element), and autograd saves the mask. Elsewhere (the CPU, and the meta
device the simulated GPU computes on) ``_dropout_impl`` makes a noise tensor of the
input's dtype (``empty_like(input).bernoulli_(1 - p).div_(1 - p)``) and multiplies:
autograd then saves the noise, 2 or 4 bytes per element. In the H200 nanoGPT recordings
(``../shared/fixtures/h200``, bf16 autocast) each ``nn.Dropout`` of a training step holds
a block of one byte per element of its input until backward; on meta it was two.
``dropout_`` (in place) copies the fused kernel's output into the input, as there.
Feature dropout (``dropout1d``/``2d``/``3d``, ``alpha_dropout``) is not fused on CUDA
either and runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["DROPOUTS", "cuda_dropout"]

#: The dropout entry points a torch-function mode sees, and whether each works in place.
DROPOUTS: dict[Any, bool] = {F.dropout: False, torch.dropout: False, torch.dropout_: True}


def cuda_dropout(func: Any, args: tuple, kwargs: dict, on_gpu: Callable[[torch.Tensor], bool]) -> Any:
    """Run ``func`` (one of :data:`DROPOUTS`) as CUDA would for a tensor ``on_gpu``
    says is on the GPU: through ``native_dropout`` when the fused kernel is acceptable,
    else as ``func`` itself."""
    names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
    given = dict(zip(names, args), **kwargs)
    tensor = given.get("input")
    p = given.get("p", 0.5)
    train = given.get("training", given.get("train", True))
    inplace = DROPOUTS[func] or bool(given.get("inplace", False))
    if not (
        isinstance(tensor, torch.Tensor)
        and tensor.is_meta
        and on_gpu(tensor)
        and train
        and isinstance(p, (int, float))
        and 0.0 < p < 1.0
        and tensor.numel() > 0
    ):
        return func(*args, **kwargs)
    out = torch.native_dropout(tensor, float(p), True)[0]
    return tensor.copy_(out) if inplace else out
