"""Linear-shaped einsums as CUDA leaves their gradients: in the parameter's layout.

``torch.einsum("...i,oi->...o", x, w)`` (a bias-free linear layer written as einsum, as
in the recorded 2.7B model) gives, on the meta device and on the CPU, a weight gradient
whose strides are transposed from the weight's, so autograd's gradient accumulation
copies it into the weight's layout: one weight-sized temporary per weight per backward.
The GPU's recorded step has no such copy (``reports/estimator_gpu_check.md``). Run as
``F.linear(x, w)`` (or ``x @ w`` for ``"...i,io->...o"``) the forward pass allocates
the same single output, and the weight gradient comes out of one matmul in the
weight's layout, as on the GPU.

:func:`as_linear` recognises the two-operand equations that are exactly such a layer:
one operand a 2-d weight, the other ``PREFIX + c`` (``PREFIX`` letters or ``...``, ``c``
the contracted letter), the output ``PREFIX + a`` with ``a`` the weight's other letter.
Anything else is left to einsum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["as_linear"]


def as_linear(equation: Any, operands: tuple) -> tuple[Callable[..., torch.Tensor], tuple] | None:
    """``(F.linear, (x, w))`` or ``(torch.matmul, (x, w))``: the call computing
    ``torch.einsum(equation, *operands)`` as a linear layer or a matmul, or None when the
    equation is not linear-shaped (see the module doc)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or len(operands) != 2 or "->" not in equation:
        return None
    if not all(isinstance(t, torch.Tensor) for t in operands):
        return None
    inputs, output = equation.replace(" ", "").split("->")
    terms = inputs.split(",")
    if len(terms) != 2:
        return None
    for w_at in (1, 0):
        weight, other = operands[w_at], operands[1 - w_at]
        call = _linear(terms[w_at], terms[1 - w_at], output, weight, other)
        if call is not None:
            return call
    return None


def _linear(w_term: str, x_term: str, output: str, weight: torch.Tensor, x: torch.Tensor) -> Any:
    if len(w_term) != 2 or "." in w_term or weight.dim() != 2 or not x_term or x_term.endswith("."):
        return None
    prefix, contracted = x_term[:-1], x_term[-1]
    if contracted not in w_term or contracted in prefix or w_term[0] == w_term[1]:
        return None
    kept = w_term.replace(contracted, "")
    if kept in prefix or output != prefix + kept or x.dim() < 1:
        return None
    return (F.linear if w_term == kept + contracted else torch.matmul), (x, weight)
