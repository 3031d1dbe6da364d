"""CUDA autocast as a torch-function-level model, for tensors autocast itself leaves alone
(meta tensors: the estimator's and the simulated GPU's).

:class:`CudaAutocast` casts floating-point arguments of the main ops of CUDA autocast's
lists (``aten/src/ATen/autocast_mode.cpp``, the CUDA lists, not the CPU's: CPU autocast
keeps ``layer_norm`` in the low precision, CUDA runs it in float32):

- lower precision (the AMP dtype): linear, convolutions, prelu, the matmul family,
  einsum, ``scaled_dot_product_attention``, ``multi_head_attention_forward`` (treated as
  one op: its inputs and projections are cast up front), RNNs (``lstm``, ``gru``, cells);
- float32: layer and group norm, ``exp``/``log``/``pow``/``rsqrt`` and the other
  pointwise functions of the list, the losses of the list, norms and distances;
- float32 output without an input copy (autocast's "set dtype" ops): ``softmax``,
  ``log_softmax``, ``sum``, ``prod``, ``cumsum``, ``cumprod``, ``linalg_vector_norm``;
  ``cross_entropy`` runs as ``nll_loss(log_softmax(x, dtype=float32))``.

Other ops run in their inputs' dtype. Casts of parameters (leaves requiring grad) are
cached until the outermost autocast region exits (:meth:`CudaAutocast.clear`), as
autocast's weight cache is. Ops that a non-listed Python function calls internally are
not seen; that is the model's main approximation. The simulated GPU's face applies it
while ``torch.autocast("cuda")`` is on (the estimator's ``amp`` is that autocast).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

__all__ = ["FLOAT32", "LOWER", "SET_DTYPE", "CudaAutocast"]

LOWER = frozenset(
    "linear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc prelu "
    "matmul __matmul__ __rmatmul__ mm mv bmm addmm addmv addr baddbmm addbmm chain_matmul einsum "
    "scaled_dot_product_attention multi_head_attention_forward "
    "lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell".split()
)
FLOAT32 = frozenset(
    "layer_norm group_norm acos asin cosh erfinv exp expm1 log log2 log10 log1p pow __pow__ rsqrt "
    "reciprocal sinh tan softplus cosine_similarity cdist dist renorm "
    "mse_loss l1_loss smooth_l1_loss huber_loss nll_loss binary_cross_entropy_with_logits "
    "kl_div poisson_nll_loss cosine_embedding_loss hinge_embedding_loss margin_ranking_loss "
    "soft_margin_loss triplet_margin_loss multi_margin_loss multilabel_margin_loss logsumexp".split()
)
SET_DTYPE = frozenset("softmax log_softmax sum prod cumsum cumprod linalg_vector_norm".split())
_NAMES = LOWER | FLOAT32 | SET_DTYPE | {"cross_entropy"}


class CudaAutocast:
    """The casts of CUDA autocast (see the module doc), with the weight-cast cache."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def clear(self) -> None:
        """Forget cached weight casts (the outermost autocast region exited)."""
        self._cache.clear()

    def call(self, func: Any, args: tuple, kwargs: dict, dtype: torch.dtype) -> Any:
        """Run ``func`` as autocast to ``dtype`` would."""
        name = getattr(func, "__name__", "")
        if name not in _NAMES:
            return func(*args, **kwargs)
        if name == "cross_entropy" and _floating(args[0]) and args[0].dtype != torch.float32:
            return _cross_entropy(*args, **kwargs)
        args, kwargs = self.cast_for(func, args, kwargs, dtype)
        return func(*args, **kwargs)

    def cast_for(self, func: Any, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
        """The arguments ``func`` gets under autocast to ``dtype``."""
        name = getattr(func, "__name__", "")
        if name in LOWER:
            return self._cast((args, kwargs), dtype)
        if name in FLOAT32:
            return self._cast((args, kwargs), torch.float32)
        if name in SET_DTYPE and kwargs.get("dtype") is None and _wants_float32(args):
            return args, {**kwargs, "dtype": torch.float32}
        return args, kwargs

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
