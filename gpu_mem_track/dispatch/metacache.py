"""Meta ops remembered by their inputs' metadata, so a training loop's repeated ops skip
their meta kernels.

On meta tensors an op computes only its outputs' metadata, but many meta kernels are
Python (PyTorch's references and decompositions: layer norm, the elementwise ops, their
backwards) and cost tens of microseconds each; a simulated training step runs thousands,
the same ones at every step. :class:`MetaCache` keys an op by the op, its arguments (each
tensor, which must be a meta tensor, by shape, strides, storage offset and dtype;
every other value by its type and value) and the default dtype, and keeps, from its first
run, what its outputs were: shape, strides, storage offset, dtype and the size of the
storage under each, and which outputs share a storage. A later call with the same key
builds fresh meta tensors with that metadata, which is all a meta kernel would have given.

Only ops whose outputs are new are kept: an op that writes into an argument, returns a
view of one, or whose output shape depends on data is always run; so is any call whose
outputs share a storage with an input, are not plain meta tensors, or whose arguments
hold a value the key cannot tell apart (anything but numbers, strings, ``None``, dtypes,
devices, layouts, memory formats, and lists and tuples of those and of tensors).
Imports torch; used by ``values.KnownValues`` for ops on tensors without known values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .lifetimes import tensor_leaves

__all__ = ["MetaCache"]

#: Entries kept before the cache starts again (a loop uses a few hundred distinct calls).
LIMIT = 20_000

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
#: Tensor types whose metadata is all a meta kernel sees (a parameter is a tensor).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_NEVER_TAGS = frozenset(
    getattr(torch.Tag, name)
    for name in ("dynamic_output_shape", "data_dependent_output", "inplace_view")
    if hasattr(torch.Tag, name)
)


#: Rebuilds a call's outputs, given the list of the storages it has built so far.
_Build = Callable[[list], Any]
#: What ``call`` finds for a key never seen.
_NEW = object()


class _Unkeyable(Exception):
    """An argument the key cannot describe."""


class MetaCache:
    """``call(func, args, kwargs)``: ``func(*args, **kwargs)`` on meta tensors, from the
    cache when an earlier call had the same key (see the module docstring). ``hits`` and
    ``misses`` count the calls answered from it and those run."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.hits = 0
        self.misses = 0
        #: each key's rebuilder of the outputs (None: they cannot be rebuilt)
        self._entries: dict[tuple, _Build | None] = {}
        self._cacheable: dict[Any, bool] = {}

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        cacheable = self._cacheable.get(func)
        if cacheable is None:
            cacheable = self._cacheable[func] = _cacheable(func)
        if not cacheable:
            return func(*args, **kwargs)
        try:
            kw = _key(tuple(sorted(kwargs.items()))) if kwargs else ()
            # the default dtype: an integer tensor with a float scalar gives that dtype
            key = (func, _key(args), kw, torch.get_default_dtype())
        except _Unkeyable:
            return func(*args, **kwargs)
        build = self._entries.get(key, _NEW)
        if build is None:  # this call's outputs cannot be rebuilt
            return func(*args, **kwargs)
        if build is not _NEW:
            self.hits += 1
            return build([])
        self.misses += 1
        out = func(*args, **kwargs)
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = _rebuilder(out, args, kwargs)
        return out


def _cacheable(func: Any) -> bool:
    """Whether ``func``'s outputs are always new tensors that metadata alone decides."""
    schema = getattr(func, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    if any(r.alias_info is not None for r in schema.returns):
        return False
    return not (_NEVER_TAGS & set(getattr(func, "tags", ())))


def _key(value: Any) -> Any:
    """A hashable description of an argument (see the module docstring)."""
    if isinstance(value, torch.Tensor):
        # only meta tensors: a meta kernel may read a CPU tensor's values
        if type(value) not in _PLAIN_TENSORS or not value.is_meta or value.is_conj() or value.is_neg():
            raise _Unkeyable
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_key(v) for v in value))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    raise _Unkeyable


def _rebuilder(out: Any, args: tuple, kwargs: dict) -> _Build | None:
    """A function that rebuilds ``out`` from the list of storages built so far (called
    with ``[]``), or None when it cannot be rebuilt from metadata."""
    inputs = {_storage_id(t) for t in tensor_leaves((args, kwargs))}
    try:
        return _recipe(out, inputs, {})
    except _Unkeyable:
        return None


def _storage_id(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _recipe(out: Any, inputs: set[int], seen: dict[int, int]) -> Callable[[list], Any]:
    """A function of the list of storages built so far that rebuilds ``out``."""
    if isinstance(out, torch.Tensor):
        if (
            type(out) is not torch.Tensor
            or not out.is_meta
            or out.requires_grad
            or out.is_conj()
            or out.is_neg()
            or out.layout != torch.strided
        ):
            raise _Unkeyable
        storage = _storage_id(out)
        if storage in inputs:
            raise _Unkeyable
        index = seen.setdefault(storage, len(seen))
        return _tensor_recipe(out, index)
    if isinstance(out, (list, tuple)):
        parts = [_recipe(item, inputs, seen) for item in out]
        kind = type(out)
        if kind not in (list, tuple):
            raise _Unkeyable  # a named tuple or other sequence type
        return lambda storages: kind(part(storages) for part in parts)
    if out is None or isinstance(out, (int, float, bool)):
        return lambda storages: out
    raise _Unkeyable


def _tensor_recipe(out: torch.Tensor, index: int) -> Callable[[list], torch.Tensor]:
    size, stride, offset, dtype = tuple(out.shape), out.stride(), out.storage_offset(), out.dtype
    nbytes = out.untyped_storage().nbytes()
    plain = offset == 0 and nbytes == _span(size, stride) * out.element_size()

    def build(storages: list) -> torch.Tensor:
        if index < len(storages):  # a storage an earlier output made
            storage = storages[index]
        elif plain:
            tensor = torch.empty_strided(size, stride, dtype=dtype, device="meta")
            storages.append(tensor.untyped_storage())
            return tensor
        else:
            storage = torch.UntypedStorage(nbytes, device="meta")
            storages.append(storage)
        return torch.empty(0, dtype=dtype, device="meta").set_(storage, offset, size, stride)

    return build


def _span(size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements a strided tensor's storage needs (0 for an empty tensor)."""
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(size, stride))
