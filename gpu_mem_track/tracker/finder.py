"""Finding live tensors, and the models and optimizers that own them, among all objects.

Finding tensors is the expensive part of a ``track()`` call. ``LiveTensorFinder`` asks
``gc.get_referrers`` for the objects that refer to the tensor classes: instances of a
Python-level class hold a reference to their class, so this returns every tensor in
one walk of the heap with no Python-level loop over the million objects (1.1-1.7x the
cost of a bare ``gc.get_objects()``, depending on what the heap holds; see
``reports/bench_census.md``). The walk's cost grows with the number of classes asked
about, so rarely used classes are asked about only when their reference count shows
they may have new instances. Between collections that move objects into the oldest
generation, only young objects are scanned.

The same walks find the program's ``nn.Module`` and ``torch.optim.Optimizer`` objects
wherever it keeps them (function locals included), so the census can name parameters
(``features.0.weight``) and tell optimizer state from other tensors without ``watch()``
and without reading any frame's locals. They are held by weak reference
(``Owners``). ``full_scan`` is the exhaustive (slower) alternative, used to check the
fast one; ``FullScan`` is the same with owners.
"""

from __future__ import annotations

import gc
import itertools
import sys
import weakref
from operator import is_not
from typing import Any

import torch
from torch import nn

__all__ = ["FullScan", "LiveTensorFinder", "Owners", "full_scan", "owner_types", "tensor_types"]

_ALWAYS_ASKED = (torch.Tensor, torch.nn.Parameter)
_CALL = weakref.ref.__call__
_OWNER_BASES = (nn.Module, torch.optim.Optimizer)


def _subclasses(*bases: type) -> list[type]:
    found: list[type] = list(bases)
    seen = set(found)
    for cls in found:
        for sub in type.__subclasses__(cls):
            if sub not in seen:
                seen.add(sub)
                found.append(sub)
    return found


def tensor_types() -> list[type]:
    """``torch.Tensor`` and every subclass currently defined, user subclasses included."""
    return _subclasses(torch.Tensor)


def owner_types() -> list[type]:
    """``nn.Module``, ``torch.optim.Optimizer`` and every subclass currently defined."""
    return _subclasses(*_OWNER_BASES)


# Objects enter generation 2 only in a gen-1 or gen-2 collection (or gc.unfreeze), so
# while those counters stand still every object born since the last walk is young.
# CPython 3.14 replaced the generations with an incremental collector: walk every time.
_YOUNG_SCAN_WORKS = sys.version_info < (3, 14) and getattr(sys, "_is_gil_enabled", lambda: True)()
_MAX_CACHED_TYPES = 10_000


def _gc_epoch() -> tuple[int, int, int]:
    stats = gc.get_stats()
    return (stats[1]["collections"], stats[2]["collections"], gc.get_freeze_count())


class Owners:
    """Live modules and optimizers seen by a finder, by weak reference.

    ``roots()`` gives the optimizers and the top-level modules (those no other live
    module holds as a direct child) with an empty name prefix, as ``watch(model)``
    would: parameters are then named from the module tree (``features.0.weight``).
    """

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}  # id(object) -> ref
        self._keys: dict[int, int] = {}  # id(ref) -> id(object), for the death callback
        self._roots: list[weakref.ref[Any]] | None = None

    def add(self, obj: Any) -> None:
        key = id(obj)
        ref = self._refs.get(key)
        if ref is not None and ref() is obj:
            return
        try:
            ref = weakref.ref(obj, self._forget)
        except TypeError:  # a subclass with __slots__ and no __weakref__: not held
            return
        self._refs[key] = ref
        self._keys[id(ref)] = key
        self._roots = None

    def _forget(self, ref: weakref.ref[Any]) -> None:
        key = self._keys.pop(id(ref), None)
        if key is not None and self._refs.get(key) is ref:
            del self._refs[key]
            self._roots = None

    def __len__(self) -> int:
        return len(self._refs)

    def roots(self) -> list[tuple[str, Any]]:
        """``("", obj)`` for each live optimizer and top-level module."""
        if self._roots is None:
            self._roots = [weakref.ref(obj) for obj in self._top_level()]
        alive = [ref() for ref in self._roots]
        return [("", obj) for obj in alive if obj is not None]

    def _top_level(self) -> list[Any]:
        objects = [obj for obj in (ref() for ref in list(self._refs.values())) if obj is not None]
        children: set[int] = set()
        for obj in objects:
            if isinstance(obj, nn.Module):
                try:
                    children.update(id(child) for child in obj._modules.values() if child is not None)
                except Exception:
                    continue
        return [obj for obj in objects if id(obj) not in children]


class LiveTensorFinder:
    """Returns the live tensor objects, walking the heap only when it must; records the
    live modules and optimizers in ``owners`` on the way.

    A full walk is one ``gc.get_referrers`` call over the tensor classes (and the module
    and optimizer classes whose reference count changed since the previous walk; the
    first walk filters ``gc.get_objects()`` instead, to meet every class once).
    ``torch.Tensor`` and ``nn.Parameter`` are always asked about; another tensor subclass
    is asked about until a walk finds none of its instances, then only once its
    reference count changes (every instance holds a reference to its class). A class
    whose count stays equal while an instance appears and an unrelated reference to it
    goes is missed by full walks until its count changes; young scans look at every class.

    Between walks, while no gen-1 or gen-2 collection has run, the tensors alive are
    those the last call found (held by weak reference) plus the tensors among the young
    objects (generations 0 and 1, a few thousand objects): a young scan. ``last_scan``
    says which of ``"full"`` and ``"young"`` the last call did.
    """

    def __init__(self) -> None:
        self._empty_refcount: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()
        self._owner_refcount: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()
        self._wanted = _WantedTypes()
        self._known: list[weakref.ref[Any]] = []
        #: The ids of ``_known``'s tensors, while none of them died (else None).
        self._known_ids: set[int] | None = None
        self._epoch: tuple[int, int, int] | None = None
        self.owners = Owners()
        self.last_scan = ""

    def __call__(self) -> list[Any]:
        epoch = _gc_epoch()
        if _YOUNG_SCAN_WORKS and epoch == self._epoch:
            found = self._young_scan()
            self.last_scan = "young"
        else:
            found = self._full_walk(tensor_types())
            self.last_scan = "full"
            self._known = list(map(weakref.ref, found))
            self._known_ids = None
        self._epoch = epoch
        return found

    def roots(self) -> list[tuple[str, Any]]:
        """The live optimizers and top-level modules found so far (see ``Owners``)."""
        return self.owners.roots()

    def _young_scan(self) -> list[Any]:
        """The tensors found before that still live (``_known``, kept in order: a census
        can then reuse what it learnt of them) and the young tensors not among them."""
        alive = list(map(_CALL, self._known))
        live = list(map(is_not, alive, itertools.repeat(None)))
        if not all(live):
            alive = list(itertools.compress(alive, live))
            self._known = list(itertools.compress(self._known, live))
            self._known_ids = None
        young = gc.get_objects(0)
        young += gc.get_objects(1)
        wanted = self._wanted
        if len(wanted) > _MAX_CACHED_TYPES:  # bounded: classes made on the fly are not kept forever
            wanted.clear()
        hits = list(itertools.compress(young, map(wanted.__getitem__, map(type, young))))
        del young
        for obj in hits:
            if wanted.is_tensor(type(obj)):
                if self._known_ids is None:  # made again only after deaths
                    self._known_ids = set(map(id, alive))
                if id(obj) not in self._known_ids:
                    alive.append(obj)
                    self._known.append(weakref.ref(obj))
                    self._known_ids.add(id(obj))
            else:
                self.owners.add(obj)
        return alive

    def _full_walk(self, classes: list[type]) -> list[Any]:
        owner_classes = owner_types()
        # Counts are read before any container of ours holds the classes, and kept: read
        # again later they would include our own references.
        counts = [sys.getrefcount(cls) for cls in classes]
        owner_counts = [sys.getrefcount(cls) for cls in owner_classes]
        if self._epoch is None:  # first walk: meet every class once, at a bare heap filter's cost
            asked = classes
            hits = _filter_heap(frozenset(classes + owner_classes))
        else:
            asked = [
                cls
                for cls, count in zip(classes, counts)
                if cls in _ALWAYS_ASKED or count != self._empty_refcount.get(cls, -1)
            ]
            changed = [
                cls
                for cls, count in zip(owner_classes, owner_counts)
                if count != self._owner_refcount.get(cls, -1)
            ]
            hits = gc.get_referrers(*asked, *changed)
            del changed
        found = _split_hits(hits, frozenset(classes), frozenset(owner_classes), self.owners)
        del hits
        self._note_empty(classes, counts, asked, {type(obj) for obj in found})
        for cls, count in zip(owner_classes, owner_counts):
            if self._owner_refcount.get(cls) != count:
                self._owner_refcount[cls] = count
        return found

    def _note_empty(
        self, classes: list[type], counts: list[int], asked: list[type], present: set[type]
    ) -> None:
        """Remember the reference count of each asked tensor subclass with no instances."""
        asked_set = set(asked)
        for cls, count in zip(classes, counts):
            if cls in _ALWAYS_ASKED or cls not in asked_set:
                continue
            if cls in present:
                self._empty_refcount.pop(cls, None)
            else:
                self._empty_refcount[cls] = count


class _WantedTypes(dict):  # type: ignore[type-arg]
    """``type -> bool``: is it a tensor, module or optimizer class (filled on first sight)."""

    def __missing__(self, cls: type) -> bool:
        try:
            wanted = issubclass(cls, (torch.Tensor, *_OWNER_BASES))
        except TypeError:
            wanted = False
        self[cls] = wanted
        return wanted

    @staticmethod
    def is_tensor(cls: type) -> bool:
        return issubclass(cls, torch.Tensor)


def _filter_heap(classes: frozenset[type]) -> list[Any]:
    """The objects of every generation whose exact type is in ``classes``."""
    objects = gc.get_objects()
    return list(itertools.compress(objects, map(classes.__contains__, map(type, objects))))


def _split_hits(
    hits: list[Any], tensor_classes: frozenset[type], owner_classes: frozenset[type], owners: Owners
) -> list[Any]:
    """The tensors among ``hits`` (exact type in ``tensor_classes``), in one pass that also
    records the modules and optimizers (exact type in ``owner_classes``) in ``owners``."""
    types = list(map(type, hits))
    for obj in itertools.compress(hits, map(owner_classes.__contains__, types)):
        owners.add(obj)
    return list(itertools.compress(hits, map(tensor_classes.__contains__, types)))


def full_scan() -> list[Any]:
    """Every live tensor object, by filtering all of ``gc.get_objects()`` (slower, exhaustive)."""
    return _filter_heap(frozenset(tensor_types()))


class FullScan:
    """``full_scan`` that also records the live modules and optimizers in ``owners``."""

    def __init__(self) -> None:
        self.owners = Owners()
        self.last_scan = ""

    def __call__(self) -> list[Any]:
        tensors, owners = frozenset(tensor_types()), frozenset(owner_types())
        hits = _filter_heap(tensors | owners)
        self.last_scan = "full"
        return _split_hits(hits, tensors, owners, self.owners)

    def roots(self) -> list[tuple[str, Any]]:
        """The live optimizers and top-level modules (see ``Owners``)."""
        return self.owners.roots()
