"""``torch.cuda.FloatTensor`` and the other legacy CUDA tensor and storage types, on a
simulated GPU.

Older scripts build CUDA tensors with ``torch.cuda.FloatTensor(2, 3)`` (sizes) or
``torch.cuda.LongTensor([1, 2])`` (data), and test ``isinstance(t,
torch.cuda.FloatTensor)``. On the CUDA build torch's own types would allocate on the
real GPU (or fail without one); on the CPU build they do not exist. Inside a simulation
:func:`legacy_types` gives stand-ins: calling one makes a simulated tensor of that
dtype (``torch.empty`` for sizes or none, ``torch.tensor`` for data), ``isinstance``
holds for a simulated tensor of that dtype, and ``.dtype``/``.is_cuda`` answer as
torch's types do. The ``...Storage`` types make the tensor's storage (a 1-d tensor of
that many elements). ``Tensor.type`` answers as on a GPU (:func:`cuda_type_name`,
:func:`cuda_type_dtype`, used by ``face``): ``t.type()`` of a simulated tensor is
``"torch.cuda.FloatTensor"``, and ``t.type(torch.cuda.HalfTensor)`` (or
``t.type("torch.cuda.HalfTensor")``) moves ``t`` to the simulated GPU in that dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["cuda_type_dtype", "cuda_type_name", "legacy_types"]

_DTYPES = {
    "BFloat16": torch.bfloat16,
    "Bool": torch.bool,
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Double": torch.float64,
    "Float": torch.float32,
    "Half": torch.float16,
    "Int": torch.int32,
    "Long": torch.int64,
    "Short": torch.int16,
}


class _LegacyType(type):
    """The metaclass: ``isinstance(t, torch.cuda.FloatTensor)`` for simulated tensors."""

    dtype: torch.dtype

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, torch.Tensor) and instance.is_cuda and instance.dtype == cls.dtype

    @property
    def is_cuda(cls) -> bool:
        return True


def _make(dtype: torch.dtype, args: tuple, kwargs: dict) -> torch.Tensor:
    device = kwargs.pop("device", "cuda")
    if len(args) == 1 and isinstance(args[0], torch.Size):
        args = tuple(args[0])
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return torch.empty(args, dtype=dtype, device=device, **kwargs)
    if len(args) == 1:
        return torch.tensor(args[0], dtype=dtype, device=device, **kwargs)
    raise TypeError(f"expected sizes or one sequence of data, got {args!r}")


def _legacy(name: str, dtype: torch.dtype, storage: bool) -> type:
    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        tensor = _make(dtype, args, dict(kwargs))
        return tensor.untyped_storage() if storage else tensor

    namespace = {"__new__": new, "dtype": dtype, "__module__": "torch.cuda", "__qualname__": name}
    return _LegacyType(name, (), namespace)


#: Storage types without a tensor type of the same name.
_STORAGE_ONLY = {"ComplexDouble": torch.complex128, "ComplexFloat": torch.complex64}


@functools.cache
def legacy_types() -> dict[str, type]:
    """``{"FloatTensor": ..., "FloatStorage": ..., ...}``: the stand-ins (module doc),
    made once (they hold no state)."""
    out = {}
    for kind, dtype in _DTYPES.items():
        out[f"{kind}Tensor"] = _legacy(f"{kind}Tensor", dtype, storage=False)
    for kind, dtype in {**_DTYPES, **_STORAGE_ONLY}.items():
        out[f"{kind}Storage"] = _legacy(f"{kind}Storage", dtype, storage=True)
    return out


def cuda_type_dtype(given: Any) -> torch.dtype | None:
    """The dtype of a legacy CUDA tensor type given to ``Tensor.type``: a stand-in such as
    ``torch.cuda.HalfTensor`` or its name ``"torch.cuda.HalfTensor"``; None for anything
    else (a dtype, a CPU type), which torch's own ``Tensor.type`` handles."""
    if isinstance(given, _LegacyType) and given.__name__.endswith("Tensor"):
        return given.dtype
    if isinstance(given, str) and given.startswith("torch.cuda.") and given.endswith("Tensor"):
        return _DTYPES.get(given[len("torch.cuda.") : -len("Tensor")])
    return None


def cuda_type_name(meta_name: str) -> str:
    """``Tensor.type()``'s answer for a tensor on the simulated GPU, from the meta
    tensor's (``"torch.meta.FloatTensor"`` -> ``"torch.cuda.FloatTensor"``)."""
    prefix = "torch.meta."
    return "torch.cuda." + meta_name[len(prefix) :] if meta_name.startswith(prefix) else meta_name
