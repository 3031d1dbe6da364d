"""Values for meta tensors, so model code that reads a tensor's data can run on them.

Meta tensors have no data, yet library code reads some: Hugging Face models check
position ids and attention masks in Python (``if (mask == 0).all():``, ``.item()``,
``.tolist()``) and index with ``nonzero``. :class:`KnownValues` is a dispatch mode that
keeps, beside every *small* meta tensor whose value can be known, a real CPU twin
computed by the same op: tensors made from nothing (``arange``, ``zeros``, ``full``,
``randn``, the estimator's integer inputs, which are zeros) and everything computed
only from such tensors, up to :data:`LIMIT` bytes of storage each. Reading a value then reads
the twin; data-dependent ops (``nonzero``, ``equal``, copies to the CPU) run on the
twins and their results go back to meta. Reading a tensor with no twin (one computed
from parameters, activations or large tensors) returns a placeholder: ``item()`` gives
0 (``False`` for bool), a copy to the CPU gives zeros. An op that writes unknown values
into a tensor drops its twin (not the twins of other views of the same storage). Every
read is recorded as a
:class:`~gpu_mem_track.estimator.records.ValueRead` for the estimate's notes, and told to
``on_read`` when given.

Data-dependent shapes of tensors without twins take their upper bound (every element
selected, see :data:`BOUNDED`): ``nonzero``/``argwhere`` give ``numel`` rows, a boolean
mask selects every element, ``masked_select`` and ``unique`` keep every element. Each is
recorded (placeholder ``"upper bound N"``) and told to ``on_bound``. GradScaler's
``_amp_foreach_non_finite_check_and_unscale_`` keeps ``found_inf`` known (zero: no inf or
NaN was found, the GPU's normal case), so ``scaler.step`` steps and the scale grows as
on the GPU. :meth:`KnownValues.assume` gives a tensor a value by fiat (the simulated
GPU takes ``isfinite``/``isnan``/``isinf`` of unknown values as finite, for the same
reason).

The twins live on the CPU, outside the tracked device, and are never counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from ..switches import switched_off
from .lifetimes import tensor_leaves
from .metacache import MetaCache
from .records import ValueRead

__all__ = ["BOUNDED", "LIMIT", "KnownValues"]

#: Largest storage (bytes) given a real twin: masks and position ids of usual batches
#: fit; larger tensors would cost real memory and time.
LIMIT = 8 << 20

_SCALAR = torch.ops.aten._local_scalar_dense.default
_COPY = torch.ops.aten._to_copy.default
_META = torch.device("meta")
_UNSCALE = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default

#: Data-dependent ops given an upper bound on tensors without a known value.
BOUNDED = ("nonzero", "argwhere", "index", "masked_select", "_unique2", "unique_dim", "unique_consecutive")


class KnownValues(TorchDispatchMode):
    """Keeps real CPU twins of small meta tensors and answers reads of their values.

    ``where()`` names the module running, for the records of reads. Enter this mode
    *before* (under) the :class:`~gpu_mem_track.dispatch.lifetimes.Lifetimes` mode, so the
    twins' own ops run with no mode active and are never counted. ``cache``: answer
    repeated ops on tensors without values from a :class:`~.metacache.MetaCache` (None:
    yes unless the environment sets ``GPU_MEM_TRACK_META_CACHE=off``).
    """

    def __init__(
        self,
        where: Callable[[], str] = lambda: "",
        on_read: Callable[[str, str], None] | None = None,
        on_bound: Callable[[str, int], None] | None = None,
        cache: bool | None = None,
    ) -> None:
        super().__init__()
        if cache is None:
            cache = not switched_off("GPU_MEM_TRACK_META_CACHE")
        #: ops on tensors without values, remembered by their inputs' metadata (None: off)
        self.cache = MetaCache() if cache else None
        self.where = where
        self.on_read = on_read
        self.on_bound = on_bound
        self.twins: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._reads: Counter[tuple[str, str, str]] = Counter()

    def restart(self) -> None:
        """Forget the reads recorded so far (the twins stay)."""
        self._reads.clear()

    def reads(self) -> tuple[ValueRead, ...]:
        """The values read since the start or :meth:`restart`: each (op, module, placeholder)
        once, with its count."""
        return tuple(
            ValueRead(op, module, placeholder, n) for (op, module, placeholder), n in self._reads.items()
        )

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        metas = [t for t in tensor_leaves((args, kwargs)) if t.is_meta]
        if func is _SCALAR and metas:
            return self._scalar(args[0])
        if not all(t in self.twins for t in metas):
            return self._unknown(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except (RuntimeError, NotImplementedError):
            if metas:
                return self._data_dependent(func, args, kwargs)
            raise
        if _small(out):
            try:
                real = self._real(func, args, kwargs)
            except (RuntimeError, NotImplementedError):
                return out  # no CPU kernel (CUDA-only ops such as flash attention): no twin
            self._twin(out, real)
        return out

    def _note(self, op: str, placeholder: str) -> None:
        self._reads[(op, self.where(), placeholder)] += 1
        if self.on_read is not None:
            self.on_read(op, placeholder)

    def _unknown(self, func: Any, args: Any, kwargs: Any) -> Any:
        """An op on a tensor without a value (the usual case): meta runs it alone."""
        try:
            out = func(*args, **kwargs) if self.cache is None else self.cache.call(func, args, kwargs)
        except (RuntimeError, NotImplementedError):
            if func is _COPY and (kwargs.get("device") or _META) != _META:
                return self._placeholder_copy(args[0], kwargs)
            if func.overloadpacket.__name__ in BOUNDED:
                return self._bounded(func, args, kwargs)
            raise
        if func._schema.is_mutable and func is not _UNSCALE:  # found_inf stays known: no infs
            self._forget_written(func, args, kwargs)
        return out

    def assume(self, tensor: torch.Tensor, value: Any) -> None:
        """Take every element of ``tensor`` (a small meta tensor) to be ``value``."""
        if _small(tensor):
            self.twins[tensor] = torch.full(tensor.shape, value, dtype=tensor.dtype)

    def _bounded(self, func: Any, args: Any, kwargs: Any) -> Any:
        """A data-dependent op at its upper bound; see the module doc."""
        name = func.overloadpacket.__name__
        out, bound = upper_bound(name, args, kwargs)
        if out is None:
            raise NotImplementedError(f"{name} on a tensor without known values has no upper bound here")
        self._reads[(name, self.where(), f"upper bound {bound}")] += 1
        if self.on_bound is not None:
            self.on_bound(name, bound)
        return out

    def _scalar(self, tensor: torch.Tensor) -> Any:
        twin = self.twins.get(tensor)
        if twin is not None:
            self._note("item", "")
            return twin.item()
        value = False if tensor.dtype == torch.bool else 0.0 if tensor.is_floating_point() else 0
        self._note("item", repr(value))
        return value

    def _data_dependent(self, func: Any, args: Any, kwargs: Any) -> Any:
        """An op meta cannot run (its output depends on data), run on the twins."""
        real = self._real(func, args, kwargs)
        device = kwargs.get("device") or _META
        name = f"copy to {device}" if func is _COPY else func.overloadpacket.__name__
        self._note(name, "")
        if device != _META:
            return real  # a copy off the meta device (.tolist(), .cpu()): the values are the answer
        out = tree_map(lambda r: r.to(_META) if isinstance(r, torch.Tensor) else r, real)
        self._twin(out, real)
        return out

    def _placeholder_copy(self, tensor: torch.Tensor, kwargs: Any) -> torch.Tensor:
        self._note("copy to " + str(kwargs["device"]), "zeros")
        dtype = kwargs.get("dtype") or tensor.dtype
        return torch.zeros(tensor.shape, dtype=dtype, device=kwargs["device"])

    def _real(self, func: Any, args: Any, kwargs: Any) -> Any:
        def real(value: Any) -> Any:
            if _is_meta(value):
                return self.twins[value]
            return torch.device("cpu") if isinstance(value, torch.device) and value == _META else value

        return func(*tree_map(real, args), **tree_map(real, kwargs))

    def _twin(self, out: Any, real: Any) -> None:
        outs, reals = tree_flatten(out)[0], tree_flatten(real)[0]
        for meta, twin in zip(outs, reals):
            if _is_meta(meta) and isinstance(twin, torch.Tensor):
                self.twins[meta] = twin

    def _forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
        """An op wrote unknown values into tensors: their twins are no longer true."""
        schema = func._schema.arguments
        for spec, value in [*zip(schema, args), *((s, kwargs.get(s.name)) for s in schema if s.kwarg_only)]:
            if spec.alias_info is not None and spec.alias_info.is_write and _is_meta(value):
                self.twins.pop(value, None)


def _is_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "meta"


def _small(out: Any) -> bool:
    metas = [t for t in tensor_leaves(out) if t.is_meta]
    return bool(metas) and all(t.untyped_storage().nbytes() <= LIMIT for t in metas)


def upper_bound(name: str, args: Any, kwargs: Any) -> tuple[Any, int]:
    """The output of the data-dependent op ``name`` with every element selected, and
    the bound taken (rows or elements); (None, 0) when it has none here."""
    first = args[0]
    if name in ("nonzero", "argwhere"):
        n = first.numel()
        return first.new_empty((n, first.dim()), dtype=torch.long), n
    if name == "masked_select":
        n = torch.broadcast_shapes(first.shape, args[1].shape).numel()
        return first.new_empty((n,)), n
    if name == "index":
        masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
        if not masks:
            return None, 0
        indices = []
        for index in args[1]:
            if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                rows = torch.ops.aten.nonzero_static(index, size=index.numel())
                indices.extend(rows.unbind(1))
            else:
                indices.append(index)
        return torch.ops.aten.index.Tensor(first, indices), sum(m.numel() for m in masks)
    if name in ("_unique2", "unique_dim", "unique_consecutive"):
        n = first.numel()
        values = first.new_empty((n,)) if name != "unique_dim" else first.new_empty(first.shape)
        inverse = first.new_empty(first.shape, dtype=torch.long)
        counts = first.new_empty((n,), dtype=torch.long)
        return (values, inverse, counts), n
    return None, 0
