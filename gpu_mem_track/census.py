"""The live-tensor census: find every tensor, count each storage once, group them.

Finding tensors is the expensive part of a ``track()`` call. ``LiveTensorFinder`` asks
``gc.get_referrers`` for the objects that refer to the tensor classes: instances of a
Python-level class hold a reference to their class, so this returns every tensor in
one walk of the heap that costs about as much as ``gc.get_objects()`` alone, with no
Python-level loop over the million objects. The walk's cost grows with the number of
classes asked about, so rarely used tensor subclasses are asked about only when their
reference count shows they may have instances (see ``LiveTensorFinder``).
``full_scan`` is the exhaustive (slower) alternative, used to check the fast one.

``take_census`` then adds what the finder cannot see or name: tensors of watched and
discovered modules and optimizers, the bases of views, and the gradients of leaf tensors
(a ``.grad`` Python never touched exists only in C++ until read).
"""

from __future__ import annotations

import collections
import gc
import itertools
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .naming import Known, known_tensors
from .records import KINDS, Census, Skipped, TensorGroup
from .units import cuda_block_bytes

__all__ = ["LiveTensorFinder", "TensorSource", "full_scan", "take_census", "tensor_types"]

#: A callable returning candidate objects; the census keeps the tensors among them.
TensorSource = Callable[[], Iterable[Any]]

_ALWAYS_ASKED = (torch.Tensor, torch.nn.Parameter)
_RANK = {kind: rank for rank, kind in enumerate(KINDS)}
_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}


def tensor_types() -> list[type]:
    """``torch.Tensor`` and every subclass currently defined, user subclasses included."""
    found: list[type] = [torch.Tensor]
    seen = {torch.Tensor}
    for cls in found:
        for sub in type.__subclasses__(cls):
            if sub not in seen:
                seen.add(sub)
                found.append(sub)
    return found


class LiveTensorFinder:
    """Returns the live tensor objects, in one ``gc.get_referrers`` walk of the heap.

    ``torch.Tensor`` and ``nn.Parameter`` are always asked about. Another subclass is
    asked about until a walk finds none of its instances; its reference count is then
    recorded, and it is asked about again only once that count grows (every instance
    holds a reference to its class). The finder holds classes only weakly.
    """

    def __init__(self) -> None:
        self._empty_refcount: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()

    def __call__(self) -> list[Any]:
        classes = tensor_types()
        refcounts = [sys.getrefcount(cls) for cls in classes]
        asked = [
            cls
            for cls, count in zip(classes, refcounts)
            if cls in _ALWAYS_ASKED or count > self._empty_refcount.get(cls, -1)
        ]
        class_set = frozenset(classes)
        found = [obj for obj in gc.get_referrers(*asked) if type(obj) in class_set]
        present = {type(obj) for obj in found}
        for cls, count in zip(classes, refcounts):
            if cls in _ALWAYS_ASKED or cls not in asked:
                continue
            if cls in present:
                self._empty_refcount.pop(cls, None)
            else:
                self._empty_refcount[cls] = count
        return found


def full_scan() -> list[Any]:
    """Every live tensor object, by filtering all of ``gc.get_objects()`` (slower, exhaustive)."""
    class_set = frozenset(tensor_types())
    objects = gc.get_objects()
    return list(itertools.compress(objects, map(class_set.__contains__, map(type, objects))))


@dataclass
class _Entry:
    tensor: torch.Tensor
    kind: str | None
    names: list[str]
    order: int
    parts: list[tuple[Any, int]] = field(default_factory=list)
    rank: tuple[int, int, int, int] = (0, 0, 0, 0)


def take_census(
    device: str,
    source: TensorSource,
    roots: list[tuple[str, Any]] = (),  # type: ignore[assignment]
) -> Census:
    """Count the storages of live tensors on ``device`` (``"cpu"``, ``"cuda:0"``, ...).

    ``source`` supplies candidate objects (``LiveTensorFinder()``, ``full_scan`` or, in
    tests, a list); non-tensors among them are ignored. ``roots`` (see ``naming``) name
    tensors and give their kind. Each storage is counted once, for the tensor that owns
    it most plausibly (a parameter before a plain tensor, a base before its views).
    CUDA storages count as the allocator's 512 B-rounded blocks. Meta and fake tensors,
    and tensors without an accessible storage, are reported in ``skipped`` instead.
    No tensor is referenced once this returns.
    """
    target = torch.device(device)
    entries = _collect(source, roots)
    skipped: dict[str, list[int]] = {}
    kept = []
    for entry in entries:
        verdict = _measure(entry, target)
        if verdict is None:
            kept.append(entry)
        elif verdict != "other device":
            reason, nominal = verdict
            tally = skipped.setdefault(reason, [0, 0])
            tally[0] += 1
            tally[1] += nominal
    census = _group(kept, str(target), target.type == "cuda")
    del entries, kept
    return Census(
        device=census.device,
        groups=census.groups,
        views=census.views,
        skipped=tuple(Skipped(r, c, b) for r, (c, b) in sorted(skipped.items())),
    )


def _collect(source: TensorSource, roots: Iterable[tuple[str, Any]]) -> list[_Entry]:
    """Named tensors first, then everything the source finds, then view bases and grads."""
    by_id: dict[int, _Entry] = {}

    def add(tensor: Any, kind: str | None, name: str | None) -> None:
        if not issubclass(type(tensor), torch.Tensor):
            return
        entry = by_id.get(id(tensor))
        if entry is None:
            by_id[id(tensor)] = entry = _Entry(tensor, kind, [], len(by_id))
        elif entry.kind is None:
            entry.kind = kind
        if name and name not in entry.names:
            entry.names.append(name)

    for known in known_tensors(list(roots)):
        add(known.tensor, known.kind, known.name)
        known = None  # type: ignore[assignment]  # drop the last reference promptly
    for obj in source():
        add(obj, None, None)
    pending = collections.deque(by_id.values())
    while pending:
        entry = pending.popleft()
        for tensor, kind, name in _relatives(entry):
            before = len(by_id)
            add(tensor, kind, name)
            if len(by_id) > before:
                pending.append(by_id[id(tensor)])
    return list(by_id.values())


def _relatives(entry: _Entry) -> list[tuple[Any, str | None, str | None]]:
    """A view's base, and a leaf tensor's gradient, which may exist only in C++ so far."""
    found: list[tuple[Any, str | None, str | None]] = []
    tensor = entry.tensor
    try:
        base = tensor._base
        if base is not None:
            found.append((base, None, None))
        if tensor.is_leaf:  # .grad of a non-leaf warns and is always None
            grad = tensor.grad
            if grad is not None:
                name = f"{entry.names[0]}.grad" if entry.names else None
                found.append((grad, "Gradient", name))
    except Exception:
        pass
    return found


def _measure(entry: _Entry, target: torch.device) -> tuple[str, int] | str | None:
    """Fill ``entry.parts``; return a skip reason, ``"other device"``, or None when kept."""
    tensor = entry.tensor
    try:
        if _is_fake(tensor):
            return "fake", _nominal_bytes(tensor)
        device = tensor.device
        if device.type == "meta":
            return "meta", _nominal_bytes(tensor)
        if device.type != target.type or (target.index is not None and device.index != target.index):
            return "other device"
        entry.parts = _storage_parts(tensor)
        if entry.kind is None:
            entry.kind = _kind_of(tensor)
        total = sum(nbytes for _, nbytes in entry.parts)
        entry.rank = (_RANK.get(entry.kind, len(KINDS)), -total, -tensor.numel(), entry.order)
    except Exception:
        return "no storage", 0
    return None


def _storage_parts(tensor: torch.Tensor) -> list[tuple[Any, int]]:
    """(storage identity, bytes) for each storage the tensor's data lives in."""
    accessors = _SPARSE_PARTS.get(tensor.layout)
    if accessors is not None:
        parts: list[tuple[Any, int]] = []
        for accessor in accessors:
            parts.extend(_storage_parts(getattr(tensor, accessor)()))
        return parts
    storage = tensor.untyped_storage()
    pointer = storage.data_ptr()
    key = (tensor.device.type, tensor.device.index, pointer) if pointer else ("impl", storage._cdata)
    return [(key, storage.nbytes())]


def _kind_of(tensor: torch.Tensor) -> str:
    if isinstance(tensor, torch.nn.Parameter):
        return "Parameter"
    buffer_class = getattr(torch.nn, "Buffer", None)
    if buffer_class is not None and isinstance(tensor, buffer_class):
        return "Buffer"
    return "Tensor"


def _is_fake(tensor: torch.Tensor) -> bool:
    fake_module = sys.modules.get("torch._subclasses.fake_tensor")
    fake_class = getattr(fake_module, "FakeTensor", None)
    return fake_class is not None and isinstance(tensor, fake_class)


def _nominal_bytes(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().nbytes())
    except Exception:
        try:
            return int(tensor.numel() * tensor.element_size())
        except Exception:
            return 0


def _group(entries: list[_Entry], device: str, on_cuda: bool) -> Census:
    """Give each storage to its best-ranked tensor; tensors left with none are views.

    A view's names pass to the tensor that owns its storage, marked ``(view)``, so a
    slice kept after its base was deleted is still found by its variable name.
    """
    entries.sort(key=lambda e: e.rank)
    owner_of: dict[Any, _Entry] = {}
    owners: list[tuple[_Entry, int]] = []
    views = 0
    for entry in entries:
        fresh = [(key, nbytes) for key, nbytes in entry.parts if key not in owner_of]
        if not fresh and entry.parts:
            views += 1
            owner = owner_of[entry.parts[0][0]]
            owner.names.extend(f"{name} (view)" for name in entry.names if name not in owner.names)
            continue
        owner_of.update((key, entry) for key, _ in fresh)
        owners.append((entry, sum(cuda_block_bytes(n) if on_cuda else n for _, n in fresh)))
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for entry, nbytes in owners:
        tensor = entry.tensor
        key = (entry.kind, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), device)
        group = groups.setdefault(key, [0, 0, []])
        group[0] += 1
        group[1] += nbytes
        group[2].extend((entry.order, name) for name in entry.names)
    result = [
        TensorGroup(*key, count=count, nbytes=nbytes, names=tuple(n for _, n in sorted(names)))
        for key, (count, nbytes, names) in groups.items()
    ]
    result.sort(key=lambda g: (_RANK.get(g.kind, len(KINDS)), -g.nbytes, g.shape, g.dtype))
    return Census(device=device, groups=tuple(result), views=views)
