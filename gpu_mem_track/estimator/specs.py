"""Parsing what users type: model factory specs, input shapes and dtype names.

Every mistake raises :class:`~gpu_mem_track.errors.UsageError` with one line naming it,
which the CLI prints before exiting 2.
"""

from __future__ import annotations

import functools
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
from .options import cast_dtype_name

__all__ = [
    "DTYPES",
    "INPUT_DTYPES",
    "InputSpec",
    "callable_name",
    "load_callable",
    "load_factory",
    "parse_cast_dtype",
    "parse_dtype",
    "parse_input",
]

#: Names accepted for an input's dtype (``32x128:int64``): every alias of ``dtypes``, the
#: floating ones and the integer and bool dtypes of token ids and masks.
INPUT_DTYPES: dict[str, torch.dtype] = {alias: getattr(torch, name) for alias, name in DTYPE_ALIASES.items()}

#: Names accepted for ``dtype`` (CLI ``--dtype``, ``estimate(dtype=...)``): the floating
#: dtypes a model can be trained in.
DTYPES: dict[str, torch.dtype] = {
    alias: dtype for alias, dtype in INPUT_DTYPES.items() if dtype.is_floating_point
}

#: Where modules loaded from a file came from, as the user wrote it: module name -> path.
_FILE_MODULES: dict[str, str] = {}


@dataclass(frozen=True)
class InputSpec:
    """One model input described by its shape and dtype (no data).

    With a ``name`` the input is passed as that keyword argument (``labels=...``),
    otherwise positionally, in order.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    name: str = ""

    def __str__(self) -> str:
        text = "x".join(map(str, self.shape))
        text = text if self.dtype == torch.float32 else f"{text}:{dtype_name(self.dtype)}"
        return f"{self.name}={text}" if self.name else text


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """A ``torch.dtype`` from ``"bf16"``, ``"int64"``, ... (or a dtype, returned as is)."""
    return torch_dtype(name)


def parse_cast_dtype(name: str | torch.dtype) -> torch.dtype:
    """The floating dtype to cast a model to (``dtype=``, ``--dtype``); one of :data:`DTYPES`.

    The rule (integer and bool dtypes refused, ``UsageError``) is
    :func:`~gpu_mem_track.estimator.options.cast_dtype_name`, shared with ``StepOptions``.
    """
    return torch_dtype(cast_dtype_name(name))


def parse_input(text: str) -> InputSpec:
    """``"64x3x32x32"``, ``"32x128:int64"`` or ``"labels=32x128:int64"`` (a keyword input)
    -> :class:`InputSpec` (sizes are positive)."""
    name, equals, rest = text.partition("=")
    if not equals:
        name, rest = "", text
    elif not name.strip().isidentifier():
        raise UsageError(f"not an input name: {name!r} in {text!r} (example: labels=32x128:int64)")
    shape_text, _, dtype_text = rest.partition(":")
    if not re.fullmatch(r"[0-9]+(x[0-9]+)*", shape_text.strip()):
        raise UsageError(
            f"not an input shape: {text!r} (examples: 64x3x32x32, 32x128:int64, labels=32x128:int64)"
        )
    shape = tuple(int(part) for part in shape_text.strip().split("x"))
    if 0 in shape:
        raise UsageError(f"input shape {text!r} has a zero size")
    return InputSpec(shape, parse_dtype(dtype_text) if dtype_text else torch.float32, name.strip())


def load_factory(spec: str) -> Callable[[], Any]:
    """The model factory named by ``"package.module:name"`` or ``"path/to/file.py:name"``."""
    return load_callable(spec, "factory")


def load_callable(spec: str, what: str = "factory") -> Callable[..., Any]:
    """The callable named by ``"package.module:name"`` or ``"path/to/file.py:name"``.

    The module is imported (a ``.py`` path is loaded as a fresh module, and
    :func:`callable_name` names its callables by that path); the callable is not called.
    ``what`` names it in messages (``"factory"``, ``"loss function"``, ``"step"``).
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise UsageError(f"not a {what}: {spec!r} (examples: mypkg.models:build, models.py:build)")
    module = _load_file(target) if target.endswith(".py") else _import(target)
    found = getattr(module, name, None)
    if not callable(found):
        raise UsageError(f"{target} has no callable named {name!r}")
    return found


def callable_name(obj: Any) -> str:
    """``"module:qualname"``; for a callable loaded from a file, ``"path.py:qualname"`` with the
    path as the user wrote it; a ``functools.partial`` by its function."""
    if isinstance(obj, functools.partial):
        return callable_name(obj.func)
    module = getattr(obj, "__module__", None) or "?"
    module = _FILE_MODULES.get(module, module)
    return f"{module}:{getattr(obj, '__qualname__', None) or type(obj).__name__}"


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
    _FILE_MODULES[module_name] = path_text
    return module
