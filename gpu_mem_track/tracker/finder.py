"""Finding live tensors, and the models and optimizers that own them, among all objects.

Finding tensors is the expensive part of a ``track()`` call. ``LiveTensorFinder`` asks
``gc.get_referrers`` for the objects that refer to the tensor classes: instances of a
Python-level class hold a reference to their class, so this returns every tensor in
one walk of the heap with no Python-level loop over the million objects (1.1-1.7x the
cost of a bare ``gc.get_objects()``, depending on what the heap holds; see
``reports/bench_census.md``). The walk's cost grows with the number of classes asked
about, so rarely used classes are asked about only when their reference count shows
they may have new instances. Between walks only young objects are scanned: a
``gc.callbacks`` entry takes the young tensors just before each collection that would
move them into the oldest generation, so only a collection it did not see forces a walk.

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
from operator import is_not, not_
from typing import Any

import torch
from torch import nn

from .. import native
from . import swapguard

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


#: The finders whose known tensors a collection must not make stale (see ``_before_promotion``).
_WATCHING: weakref.WeakSet[LiveTensorFinder] = weakref.WeakSet()


def _before_promotion(phase: str, info: dict[str, Any]) -> None:
    """``gc.callbacks`` entry: before a collection that moves young objects into the
    oldest generation (generation 1 or 2), each live finder takes the young tensors into
    its known ones, so its next call can still scan only the young objects. Removes
    itself once no finder is left."""
    if not _WATCHING:
        try:
            gc.callbacks.remove(_before_promotion)
        except ValueError:
            pass
        return
    if info.get("generation", 0) < 1:
        return
    for finder in list(_WATCHING):
        finder._around_collection(phase)


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

    Between walks, the tensors alive are those the last call found (held by weak
    reference) plus the tensors among the young objects (generations 0 and 1, a few
    thousand objects): a young scan. A collection that moves young objects into the
    oldest generation would hide the tensors born since; so a ``gc.callbacks`` entry
    takes them into the known ones just before such a collection (the cost of a young
    scan, at gen-1 and gen-2 collections only). Only a collection the entry did not see
    (``gc.freeze()``, a collection during a census in another thread) makes the next
    call walk the heap. Not seen at all: ``gc.freeze()`` then ``gc.unfreeze()`` between
    two calls (the young objects move to the oldest generation without a collection, and
    the freeze count is back where it was); the tensors born before them are missed
    until the next walk. ``last_scan`` says which of ``"full"`` and ``"young"`` the last
    call did.

    With the native reader (``gpu_mem_track.native``) the weak references are taken out
    of the collector's lists (they hold no callback and cannot be in a cycle), so they
    never count among the young objects a scan reads.
    """

    def __init__(self) -> None:
        self._empty_refcount: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()
        self._owner_refcount: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()
        self._wanted = _WantedTypes()
        #: The tensors the last call returned, by weak reference, in order; their ids alongside.
        self._known: list[weakref.ref[Any]] = []
        self._ids: list[int] = []
        #: The same ids as a set, made when a young scan first needs it (None until then:
        #: a first census of many tensors does not pay for it).
        self._id_set: set[int] | None = None
        #: Young tensors taken before a collection since the last call (known ones among them).
        self._pending: list[weakref.ref[Any]] = []
        self._epoch: tuple[int, int, int] | None = None
        self.owners = Owners()
        self.last_scan = ""
        #: Inside ``__call__``: a collection now (another thread's) only makes the state stale.
        self._busy = False
        #: Whether the state was current when the collection under way began.
        self._current = False
        swapguard.hold(self)  # its weak references must not block torch.utils.swap_tensors

    def __call__(self) -> list[Any]:
        self._busy = True
        try:
            epoch = _gc_epoch()
            if _YOUNG_SCAN_WORKS and epoch == self._epoch:
                found = self._young_scan()
                self.last_scan = "young"
            else:
                found = self._full_walk(tensor_types())
                self.last_scan = "full"
                self._known = _refs(found)
                self._ids = list(map(id, found))
                self._id_set = None
            self._pending = []
            # a collection by another thread meanwhile: the state may miss tensors
            self._epoch = epoch if _gc_epoch() == epoch else None
        finally:
            self._busy = False
        if _YOUNG_SCAN_WORKS:
            _WATCHING.add(self)
            if _before_promotion not in gc.callbacks:
                gc.callbacks.append(_before_promotion)
        return found

    def roots(self) -> list[tuple[str, Any]]:
        """The live optimizers and top-level modules found so far (see ``Owners``)."""
        return self.owners.roots()

    def release(self, tensors: tuple[Any, ...]) -> None:
        """Before ``torch.utils.swap_tensors``, which refuses a tensor with any weak
        reference (see ``swapguard``): drop every weak reference to the known tensors, so
        the next call walks the heap. Dropping them all costs one walk, where finding the
        two among the known ones would cost a pass over them for each swap (a model's
        ``.to()`` swaps every parameter)."""
        if self._known or self._pending:
            self._known, self._ids, self._pending = [], [], []
            self._id_set = None
            self._epoch = None

    def _around_collection(self, phase: str) -> None:
        """Before a gen-1 or gen-2 collection: take the young tensors (and models and
        optimizers); after it: the state is current again if it was before."""
        try:
            if phase == "start":
                self._current = not self._busy and self._epoch is not None and self._epoch == _gc_epoch()
                if self._current:
                    tensors = self._young_hits()
                    self._pending.extend(_refs(tensors, load=False))
                    del tensors
                    if len(self._pending) > 2 * len(self._known) + 10_000:  # bounded by the live
                        self._pending = [ref for ref in self._pending if ref() is not None]
            elif phase == "stop":
                self._epoch = _gc_epoch() if self._current else None
                self._current = False
        except Exception:  # never into the program's allocation: walk the heap next time
            self._epoch = None
            self._current = False

    def _young_hits(self) -> list[Any]:
        """The tensors among the young objects; the models and optimizers among them go to
        ``owners``."""
        young = gc.get_objects(0)
        young += gc.get_objects(1)
        wanted = self._wanted
        if len(wanted) > _MAX_CACHED_TYPES:  # bounded: classes made on the fly are not kept forever
            wanted.clear()
        hits = list(itertools.compress(young, map(wanted.__getitem__, map(type, young))))
        del young
        tensors = []
        for obj in hits:
            if wanted.is_tensor(type(obj)):
                tensors.append(obj)
            else:
                self.owners.add(obj)
        return tensors

    def _young_scan(self) -> list[Any]:
        """The tensors found before that still live (``_known``, kept in order) and the
        young tensors (or taken before a collection) not among them."""
        alive, live = _alive(self._known)
        if live is not None:  # some died
            if self._id_set is not None:
                self._id_set.difference_update(itertools.compress(self._ids, map(not_, live)))
            self._known = list(itertools.compress(self._known, live))
            self._ids = list(itertools.compress(self._ids, live))
        candidates = self._young_hits()
        candidates += [obj for obj in map(_CALL, self._pending) if obj is not None]
        born = []
        if candidates:
            if self._id_set is None:
                self._id_set = set(self._ids)
            known = self._id_set
            for obj in candidates:
                key = id(obj)
                if key not in known:
                    known.add(key)
                    born.append(obj)
        if born:
            alive += born
            self._known += _refs(born)
            self._ids += map(id, born)
        return alive

    def _full_walk(self, classes: list[type]) -> list[Any]:
        owner_classes = owner_types()
        # Counts are read before any container of ours holds the classes, and kept: read
        # again later they would include our own references.
        counts = [sys.getrefcount(cls) for cls in classes]
        owner_counts = [sys.getrefcount(cls) for cls in owner_classes]
        if self._epoch is None:  # first walk: meet every class once, at a bare heap filter's cost
            pick = getattr(native.census_scan(), "pick", None)
            if pick is not None:  # the native reader's one pass over the heap
                found, owners = pick(gc.get_objects(), frozenset(classes), frozenset(owner_classes))
                for obj in owners:
                    self.owners.add(obj)
                del owners
                self._note_empty(classes, counts, classes, set(map(type, found)))
                self._note_owner_counts(owner_classes, owner_counts)
                return found  # type: ignore[no-any-return]
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
        self._note_owner_counts(owner_classes, owner_counts)
        return found

    def _note_owner_counts(self, owner_classes: list[type], owner_counts: list[int]) -> None:
        """Remember each module and optimizer class's reference count at this walk."""
        for cls, count in zip(owner_classes, owner_counts):
            if self._owner_refcount.get(cls) != count:
                self._owner_refcount[cls] = count

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


def _alive(refs: list[weakref.ref[Any]]) -> tuple[list[Any], Any]:
    """The objects ``refs`` still refer to, and None when all do, else a flag per reference
    (the native reader's one pass when loaded)."""
    reader = getattr(native.loaded(), "alive", None)
    if reader is not None:
        return reader(refs)  # type: ignore[no-any-return]
    objects = list(map(_CALL, refs))
    live = list(map(is_not, objects, itertools.repeat(None)))
    if all(live):
        return objects, None
    return list(itertools.compress(objects, live)), live


def _refs(tensors: list[Any], load: bool = True) -> list[weakref.ref[Any]]:
    """Weak references to ``tensors``, out of the collector's lists when the native reader
    can take them out (they hold no callback, so they can be in no cycle): young scans
    then never read them. ``load``: look for the reader if not loaded yet (not from
    within a collection)."""
    reader = native.census_scan() if load else native.loaded()
    make = getattr(reader, "refs", None)
    if make is not None:  # made and untracked in one pass
        return make(tensors)  # type: ignore[no-any-return]
    refs = list(map(weakref.ref, tensors))
    untrack = getattr(reader, "untrack", None)
    if untrack is not None:
        untrack(refs)
    return refs


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
