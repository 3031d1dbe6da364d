"""CUDA autocast as a torch-function-level model, for tensors autocast itself leaves alone
(meta tensors: the estimator's and the simulated GPU's).

:class:`CudaAutocast` casts floating-point arguments of the main ops of CUDA autocast's
lists (``aten/src/ATen/autocast_mode.cpp``, the CUDA lists, not the CPU's: CPU autocast
keeps ``layer_norm`` in the low precision, CUDA runs it in float32):

- lower precision (the AMP dtype): linear, convolutions, prelu, the matmul family
  (``linalg_vecdot`` and ``linalg_multi_dot`` included), einsum,
  ``scaled_dot_product_attention``, ``multi_head_attention_forward`` (treated as one op:
  its inputs and projections are cast up front), RNNs (``lstm``, ``gru``, cells);
- float32: layer, group and RMS norm, ``interpolate`` (its ``upsample_*`` ops; not
  ``mode="area"``), ``exp``/``log``/``pow``/``rsqrt`` and the other pointwise functions
  of the list, the losses of the list, norms and distances;
- float32 output without an input copy (autocast's "set dtype" ops): ``softmax``,
  ``log_softmax``, ``sum``, ``prod``, ``cumsum``, ``cumprod``, ``linalg_vector_norm``,
  ``linalg_matrix_norm`` and ``norm`` (which calls one of those two);
  ``cross_entropy`` is on no list: its decomposition (``LossNLL.cpp``) runs with
  autocast on, so ``log_softmax(x, 1, x.dtype)`` keeps the low precision (the dtype is
  given) and ``nll_loss`` (float32 list) takes a float32 copy of it: for bf16 logits a
  bf16 then a float32 logits-sized block, both saved for backward (the order, sizes and
  lifetimes of the H200 nanoGPT recordings, whose out-of-memory asked for the bf16 one).

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
from torch.nn import _reduction
from torch.utils._pytree import tree_map

__all__ = ["FLOAT32", "LOWER", "SET_DTYPE", "CudaAutocast"]

LOWER = frozenset(
    "linear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc prelu "
    "matmul __matmul__ __rmatmul__ mm mv bmm addmm addmv addr baddbmm addbmm chain_matmul einsum "
    "linalg_vecdot linalg_multi_dot scaled_dot_product_attention multi_head_attention_forward "
    "lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell".split()
)
FLOAT32 = frozenset(
    "layer_norm group_norm rms_norm acos asin cosh erfinv exp expm1 log log2 log10 log1p pow __pow__ rsqrt "
    "reciprocal sinh tan softplus cosine_similarity cdist pdist dist renorm interpolate "
    "mse_loss l1_loss smooth_l1_loss huber_loss nll_loss binary_cross_entropy_with_logits "
    "kl_div poisson_nll_loss cosine_embedding_loss hinge_embedding_loss margin_ranking_loss "
    "soft_margin_loss triplet_margin_loss multi_margin_loss multilabel_margin_loss logsumexp".split()
)
SET_DTYPE = frozenset(
    "softmax log_softmax sum prod cumsum cumprod linalg_vector_norm linalg_matrix_norm norm".split()
)
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
        if name == "cross_entropy" and _floating(args[0]) and args[0].is_meta:
            return self._cross_entropy(dtype, *args, **kwargs)
        args, kwargs = self.cast_for(func, args, kwargs, dtype)
        return func(*args, **kwargs)

    def cast_for(self, func: Any, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
        """The arguments ``func`` gets under autocast to ``dtype``."""
        name = getattr(func, "__name__", "")
        if name in LOWER:
            return self._cast((args, kwargs), dtype)
        if name in FLOAT32 and not (name == "interpolate" and _area(args, kwargs)):
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

    def _cross_entropy(
        self,
        dtype: torch.dtype,
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> torch.Tensor:
        """``cross_entropy_loss_symint`` of ``LossNLL.cpp`` with each op it calls under
        autocast's policy (see the module doc)."""
        if size_average is not None or reduce is not None:
            reduction = _reduction.legacy_get_string(size_average, reduce)

        def run(func: Any, *args: Any, **kwargs: Any) -> Any:
            return self.call(func, args, kwargs, dtype)

        dim = 0 if logits.dim() == 1 else 1
        classes = logits.shape[dim]
        logs = F.log_softmax(logits, dim, dtype=logits.dtype)
        if logits.shape == target.shape and target.is_floating_point():
            if label_smoothing > 0.0:
                target = target * (1 - label_smoothing) + label_smoothing / classes
            terms = logs * target
            if weight is not None:
                terms = terms * _class_view(weight, logs.dim(), dim)
            if reduction == "none":
                return -run(torch.sum, terms, dim)
            total = -run(torch.sum, terms)
            return total if reduction == "sum" else total / max(logs.numel() // max(classes, 1), 1)
        nll = run(F.nll_loss, logs, target, weight, ignore_index=ignore_index, reduction=reduction)
        if label_smoothing <= 0.0:
            return nll
        return _smoothed(run, nll, logs, target, weight, dim, ignore_index, reduction, label_smoothing)


def _class_view(weight: torch.Tensor, dims: int, dim: int) -> torch.Tensor:
    shape = [1] * dims
    shape[dim] = weight.shape[0]
    return weight.view(shape)


def _smoothed(
    run: Any,
    nll: torch.Tensor,
    logs: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    dim: int,
    ignore_index: int,
    reduction: str,
    smoothing: float,
) -> torch.Tensor:
    """The label-smoothing tail of ``cross_entropy_loss_label_smoothing``."""
    terms = logs if weight is None else logs * _class_view(weight, logs.dim(), dim)
    smooth = -run(torch.sum, terms, dim)
    ignored = target == ignore_index
    smooth.masked_fill_(ignored, 0.0)
    if reduction == "mean":
        if weight is None:
            total = run(torch.sum, smooth) / run(torch.sum, ~ignored)
        else:
            total = run(torch.sum, smooth) / weight.gather(0, target.masked_select(~ignored).flatten()).sum()
    else:
        total = run(torch.sum, smooth) if reduction == "sum" else smooth
    return (1 - smoothing) * nll + total * (smoothing / logs.shape[dim])


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _area(args: tuple, kwargs: dict) -> bool:
    """``F.interpolate``'s ``mode="area"`` runs ``adaptive_avg_pool``, on no list (the
    other modes run ``upsample_*``, on the float32 list)."""
    return (args[2] if len(args) > 2 else kwargs.get("mode", "nearest")) == "area"


def _wants_float32(args: Any) -> bool:
    first = args[0] if args else None
    return _floating(first) and first.dtype in (torch.float16, torch.bfloat16)
