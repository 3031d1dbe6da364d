"""Parsing what users type: model factory specs, input shapes and dtype names.

Every mistake raises :class:`~gpu_mem_track.errors.UsageError` with one line naming it,
which the CLI prints before exiting 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..dtypes import DTYPE_ALIASES, dtype_name, torch_dtype
from ..errors import UsageError

__all__ = ["DTYPES", "InputSpec", "load_factory", "parse_dtype", "parse_input"]

#: Names accepted for ``dtype`` (CLI ``--dtype``, ``estimate(dtype=...)``), see ``dtypes``.
DTYPES: dict[str, torch.dtype] = {alias: getattr(torch, name) for alias, name in DTYPE_ALIASES.items()}


@dataclass(frozen=True)
class InputSpec:
    """One model input described by its shape and dtype (no data)."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __str__(self) -> str:
        text = "x".join(map(str, self.shape))
        return text if self.dtype == torch.float32 else f"{text}:{dtype_name(self.dtype)}"


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """A ``torch.dtype`` from ``"bf16"``, ``"float16"``, ... (or a dtype, returned as is)."""
    return torch_dtype(name)


def parse_input(text: str) -> InputSpec:
    """``"64x3x32x32"`` or ``"32x128:int64"`` -> :class:`InputSpec` (sizes are positive)."""
    shape_text, _, dtype_text = text.partition(":")
    if not re.fullmatch(r"[0-9]+(x[0-9]+)*", shape_text.strip()):
        raise UsageError(f"not an input shape: {text!r} (examples: 64x3x32x32, 32x128:int64)")
    shape = tuple(int(part) for part in shape_text.strip().split("x"))
    if 0 in shape:
        raise UsageError(f"input shape {text!r} has a zero size")
    return InputSpec(shape, parse_dtype(dtype_text) if dtype_text else torch.float32)


def load_factory(spec: str, what: str = "factory") -> Callable[..., Any]:
    """The callable named by ``"package.module:name"`` or ``"path/to/file.py:name"``.

    The module is imported (a ``.py`` path is loaded as a fresh module); the callable is
    not called. ``what`` names it in error messages (``"factory"``, ``"step"``).
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise UsageError(f"not a {what}: {spec!r} (examples: mypkg.models:build, models.py:build)")
    module = _load_file(target) if target.endswith(".py") else _import(target)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UsageError(f"{target} has no callable named {name!r}")
    return factory


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise UsageError(f"cannot import {name!r}: {exc}") from None


def _load_file(path_text: str) -> Any:
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    module_name = f"_gpu_mem_track_factory_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise UsageError(f"{path} raised {type(exc).__name__} on import: {exc}") from None
    return module
