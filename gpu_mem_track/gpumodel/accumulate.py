"""Gradient sums that autograd makes out of place only because a Python dispatch mode is
on: done in place, as CUDA (or any device, without a mode) does them.

``at::isTensorSubclassLike`` answers true for every tensor while a Python dispatch mode is
active, and the storage tracker (:class:`~gpu_mem_track.dispatch.lifetimes.Lifetimes`) is
one. Two kinds of autograd code then take a branch that allocates one more block:

* the engine's input buffer (``torch/csrc/autograd/input_buffer.cpp``, ``accumulate`` and
  ``can_accumulate_inplace``): with grad mode off, a gradient arriving where one is
  already held is added in place (``old.add_(new)``) when ``old`` is a plain dense tensor
  whose ``TensorImpl`` and storage have one reference each (only the buffer holds it);
  otherwise, and always under a mode, ``old + new``. :class:`InPlaceSums` recognises that
  ``add.Tensor`` and runs ``add_`` when the first operand is held alone. Its reference
  count is read from the ``TensorImpl`` (no Python API gives it) and compared with the
  count a gradient held only by an input buffer shows inside a dispatch mode, measured
  once per process by :func:`reference_counts` (the rule is off when that measurement
  does not come out as expected, e.g. on a torch whose layout differs);
* backward formulas with a subclass branch (``torch/csrc/autograd/FunctionsManual.cpp``:
  ``value_selecting_reduction_backward`` for max/min/median over a dim, ``index_backward``,
  ``gather_backward``, ``index_select_backward``): they make zeros and ``scatter_``,
  ``_index_put_impl_``, ``scatter_add_`` or ``index_add_`` into them; under a mode the
  out-of-place op, a second input-sized block. :class:`InPlaceSums` runs the in-place op
  when the operand is the zeros made by the op just before, in backward.

A formula's own ``a + b`` (``atan2``'s backward) is told from the input buffer's by where
``a`` was born: the buffer's sum adds into a gradient an earlier node made; a sum into a
tensor made by the node now running (its own temporary, or ``y * y``'s two gradients) is
left out of place, so the latter keeps one extra block (the differences table's row).
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = ["InPlaceSums", "reference_counts"]

_ADD = torch.ops.aten.add.Tensor
_ZEROS = frozenset(
    {torch.ops.aten.new_zeros.default, torch.ops.aten.zeros.default, torch.ops.aten.zeros_like.default}
)
#: Out-of-place ops of the formulas' subclass branches -> the in-place op CUDA runs.
_SCATTERS: dict[Any, Callable[..., torch.Tensor]] = {
    torch.ops.aten.scatter.src: torch.ops.aten.scatter_.src,
    torch.ops.aten.scatter.value: torch.ops.aten.scatter_.value,
    torch.ops.aten.scatter_add.default: torch.ops.aten.scatter_add_.default,
    torch.ops.aten.index_add.default: torch.ops.aten.index_add_.default,
}
_INDEX_PUT = torch.ops.aten.index_put.default


def impl_references(tensor: torch.Tensor) -> int:
    """The strong reference count of ``tensor``'s ``TensorImpl`` (c10's ``intrusive_ptr``
    count: the low 32 bits of the word after the vtable pointer, in every layout torch
    has had)."""
    return ctypes.c_uint32.from_address(tensor._cdata + 8).value


def storage_references(tensor: torch.Tensor) -> int:
    """The strong reference count of ``tensor``'s storage, as seen through a Python storage
    object (which adds its own)."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


class _Probe(TorchDispatchMode):
    """Records the operands' counts of each gradient sum in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _ADD and torch._C._current_graph_task_id() != -1:
            self.seen.append((impl_references(args[0]), storage_references(args[0])))
        return func(*args, **(kwargs or {}))


@functools.cache
def reference_counts() -> tuple[int, int] | None:
    """The (``TensorImpl``, storage) counts of a gradient held only by autograd's input
    buffer as a dispatch mode sees it, or None when they cannot be measured. Measured on
    two graphs: ``y`` used twice (the first gradient held alone), and a sum's gradient
    passed through to both operands before a second gradient arrives at each (held by
    two buffers at the first sum, alone at the second and at the leaf's): the shared one
    must count one more, else None."""
    try:
        with torch._C.DisableTorchFunction(), _disable_current_modes(), torch.device("meta"):
            x = torch.ones(4, 4, requires_grad=True)
            probe = _Probe()
            with probe:
                y = x * 2
                ((y * 3).sum() + (y * 4).sum()).backward()
                u, v = x * 2, x * 3
                p, q, s = (u * 5).sum(), (v * 7).sum(), u + v
                (p + q + s.sin().sum()).backward()
    except Exception:  # noqa: BLE001 - no measurement, no rule
        return None
    if len(probe.seen) != 4:  # y's sum; u's, v's, then x's (the leaf's input buffer)
        return None
    alone, shared, *others = probe.seen
    if shared != (alone[0] + 1, alone[1]) or others != [alone, alone]:
        return None
    return alone


def _dense(tensor: torch.Tensor) -> bool:
    """c10's ``is_non_overlapping_and_dense``: the elements fill the storage span exactly
    once in some order of the dimensions (contiguous, channels-last, a permutation)."""
    if tensor.is_contiguous():
        return True
    expected = 1
    dims = sorted((st, s) for s, st in zip(tensor.shape, tensor.stride()) if s != 1)
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


class InPlaceSums:
    """The two rules of the module doc for one storage tracker. ``in_place(func, args,
    kwargs, born_here)`` (in backward, before the op runs) returns a callable that runs the
    in-place op CUDA would and returns its result (the first operand), or None when the
    op must run as it is; ``born_here(tensor)`` says whether the tensor's storage was made
    by the autograd node now running. ``saw(func, out)`` is told every op run in
    backward."""

    def __init__(self, counts: tuple[int, int] | None = None) -> None:
        self.counts = counts if counts is not None else reference_counts()
        self._zeros: weakref.ref | None = None
        self.summed = 0  # gradient sums done in place
        self.scattered = 0  # formula scatters done in place

    def in_place(
        self, func: Any, args: tuple, kwargs: dict | None, born_here: Callable[[torch.Tensor], bool]
    ) -> Callable[[], torch.Tensor] | None:
        zeros, self._zeros = self._zeros, None
        if func is _ADD:
            return self._sum(args, kwargs, born_here)
        if zeros is None or not args or args[0] is not zeros():
            return None
        if func in _SCATTERS:
            inplace = _SCATTERS[func]
        elif func is _INDEX_PUT:
            args = (*args[:4], *([False] * (4 - len(args))), True)[:5]  # accumulate, unsafe
            inplace = torch.ops.aten._index_put_impl_.default
        else:
            return None
        self.scattered += 1
        return functools.partial(inplace, *args, **(kwargs or {}))

    def saw(self, func: Any, out: Any) -> None:
        """Remember zeros just made in backward (the formulas' target)."""
        self._zeros = weakref.ref(out) if func in _ZEROS and isinstance(out, torch.Tensor) else None

    def _sum(
        self, args: tuple, kwargs: dict | None, born_here: Callable[[torch.Tensor], bool]
    ) -> Callable[[], torch.Tensor] | None:
        if self.counts is None or torch.is_grad_enabled() or len(args) != 2 or kwargs:
            return None
        old, new = args
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return None
        if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
            return None
        if old.is_sparse or old.is_nested or old._is_zerotensor() or old.requires_grad:
            return None
        if (impl_references(old), storage_references(old)) != self.counts:
            return None
        if not _dense(old) or born_here(old):
            return None
        self.summed += 1
        return functools.partial(torch.ops.aten.add_.Tensor, old, new)
