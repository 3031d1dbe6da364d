"""Dtype names, torch-free: the one ``dtype_name`` and the aliases users may type.

A ``torch.dtype`` prints as ``torch.float32``; its name is ``float32``. The aliases
(``bf16``, ``half``, ``long``, ...) map to those names, and ``torch_dtype`` turns a name
into the ``torch.dtype`` (importing torch only then).
"""

from __future__ import annotations

from typing import Any

from .errors import UsageError

__all__ = ["DTYPE_ALIASES", "canonical_dtype", "dtype_name", "torch_dtype"]

#: Names accepted for a dtype (input specs such as ``32x128:int64``; ``--dtype`` and
#: ``estimate(dtype=...)`` take the floating ones, ``estimator.options.CAST_DTYPES``), by
#: the name ``torch`` gives the dtype.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float32": "float32",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp64": "float64",
    "float64": "float64",
    "int64": "int64",
    "long": "int64",
    "int32": "int32",
    "bool": "bool",
}

_NAMES: dict[Any, str] = {}  # dtype -> name; the census asks once per tensor


def dtype_name(dtype: Any) -> str:
    """``torch.float32`` -> ``"float32"`` (any object printing as ``torch.<name>``)."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def canonical_dtype(value: Any) -> str:
    """The torch name of a dtype given as an alias (``"bf16"`` -> ``"bfloat16"``, case
    ignored) or as a ``torch.dtype``. Raises ``UsageError`` listing the aliases otherwise."""
    if type(value).__name__ == "dtype" and str(value).startswith("torch."):
        return dtype_name(value)
    name = DTYPE_ALIASES.get(str(value).lower()) if isinstance(value, str) else None
    if name is None:
        raise UsageError(f"unknown dtype {value!r} (choose from {', '.join(DTYPE_ALIASES)})")
    return name


def torch_dtype(value: Any) -> Any:
    """The ``torch.dtype`` for an alias, a torch name or a dtype (imports torch)."""
    import torch

    if isinstance(value, torch.dtype):
        return value
    return getattr(torch, canonical_dtype(value))
