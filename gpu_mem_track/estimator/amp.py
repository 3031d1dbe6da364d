"""A model of CUDA autocast for meta tensors, which autocast itself leaves alone.

``SimulatedAutocast`` is a torch-function mode: it sees calls at the Python API level
(``F.linear``, ``torch.matmul``, ``F.layer_norm``, ...) and casts floating-point
arguments as CUDA autocast would for the main ops of its lists:

- lower precision (the AMP dtype): linear, convolutions, matmul family, einsum,
  ``scaled_dot_product_attention``, ``multi_head_attention_forward`` (treated as one op:
  its inputs and projections are cast up front), RNNs (``lstm``, ``gru``, cells);
- float32: layer and group norm, ``exp``/``log``/``pow``/``rsqrt``, the regression and
  NLL losses;
- float32 output without an input copy (autocast's "set dtype" ops): ``softmax``,
  ``log_softmax``, ``sum``, ``prod``, ``cumsum``, ``cumprod``; ``cross_entropy`` runs as
  ``nll_loss(log_softmax(x, dtype=float32))``.

Other ops run in their inputs' dtype. Casts of parameters are cached until the mode
exits, as autocast's weight cache is. Ops that a non-listed Python function calls
internally are not seen; that is the model's main approximation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

__all__ = ["SimulatedAutocast"]

LOWER = frozenset(
    "linear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d prelu "
    "matmul __matmul__ __rmatmul__ mm bmm addmm baddbmm addbmm einsum "
    "scaled_dot_product_attention multi_head_attention_forward "
    "lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell".split()
)
FLOAT32 = frozenset(
    "layer_norm group_norm exp log log2 log10 log1p pow __pow__ rsqrt reciprocal softplus "
    "mse_loss l1_loss smooth_l1_loss huber_loss nll_loss binary_cross_entropy_with_logits "
    "kl_div logsumexp".split()
)
SET_DTYPE = frozenset("softmax log_softmax sum prod cumsum cumprod".split())


class SimulatedAutocast(TorchFunctionMode):
    """Casts as CUDA autocast to ``dtype`` (float16 or bfloat16) would; see the module doc."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __exit__(self, *exc: Any) -> None:
        self._cache.clear()
        return super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "cross_entropy" and _floating(args[0]) and args[0].dtype != torch.float32:
            return _cross_entropy(*args, **kwargs)
        if name in LOWER:
            args, kwargs = self._cast((args, kwargs), self.dtype)
        elif name in FLOAT32:
            args, kwargs = self._cast((args, kwargs), torch.float32)
        elif name in SET_DTYPE and kwargs.get("dtype") is None and _wants_float32(args):
            kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)

    def _cast(self, tree: Any, dtype: torch.dtype) -> Any:
        def cast(value: Any) -> Any:
            if not _floating(value) or value.dtype == dtype or value.dtype == torch.float64:
                return value
            if not (value.is_leaf and value.requires_grad):
                return value.to(dtype)
            cached = self._cache.get(id(value))
            if cached is None or cached[0] is not value or cached[1].dtype != dtype:
                cached = (value, value.to(dtype))
                self._cache[id(value)] = cached
            return cached[1]

        return tree_map(cast, tree)


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _wants_float32(args: Any) -> bool:
    first = args[0] if args else None
    return _floating(first) and first.dtype in (torch.float16, torch.bfloat16)


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if args or set(kwargs) - {"reduction", "ignore_index", "weight"}:
        return F.cross_entropy(logits.float(), target, *args, **kwargs)
    return F.nll_loss(F.log_softmax(logits, 1, dtype=torch.float32), target, **kwargs)
