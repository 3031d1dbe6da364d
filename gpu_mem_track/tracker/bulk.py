"""The census's fast path: plain tensors read in bulk, what they are remembered.

Most live tensors of a big program are plain (exactly ``torch.Tensor`` or
``nn.Parameter``), own their storage whole and are the same objects from one census to
the next (named ones too: their kinds and names are the census's business). For these
the census needs the storage's identity and size and the tensor's group (kind, shape,
dtype). ``split`` reads them in C-level passes (``map`` over
the whole list, no Python code per tensor):

- every census: the version counter, the data pointer and ``requires_grad``;
- only for a tensor not seen before, or whose version counter or data pointer changed
  since: its group, device, layout, storage offset and size, and whether it is a view,
  kept in ``CensusMemo`` under the tensor's id with a weak reference proving that the id
  still names the same object. (Reading a storage's size makes a Python storage object,
  which costs more than all the other reads: it is done once per tensor and change.)

A tensor goes to the census's general path when it is not that simple: a view, not
strided, not at the start of its storage, requiring grad (its ``.grad`` may exist only in
C++), without a version counter (inference tensors), with an empty storage, on the meta
device, sharing its storage with another tensor, or reached by the general path too
(``census.take_census`` moves those). Tensors on other devices are dropped here.

Memory: the memo holds about 400 bytes per plain tensor (its entry and weak reference),
bounded by the live tensors (entries of dead ones are dropped once they outnumber them).

Limits, as both leave the version counter and the data pointer as they were: a tensor
whose ``.data`` is replaced by another tensor starting at the same address keeps its
previous shape and dtype in the census until its version changes, and a storage resized in
place (``untyped_storage().resize_``) to another size that lands at the same address keeps
its previous size (FSDP2 resizes to nothing and back to the same size: unaffected).
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from dataclasses import dataclass, field
from operator import and_, attrgetter, eq, is_, is_not, itemgetter, not_, or_, truth
from typing import Any

import torch

from ..dtypes import dtype_name
from ..units import cuda_block_bytes
from . import swapguard

__all__ = ["Bulk", "CensusMemo", "add_groups", "settle", "split"]

_PLAIN = {torch.Tensor: "Tensor", torch.nn.Parameter: "Parameter"}
_VERSION = attrgetter("_version")
_REQUIRES_GRAD = attrgetter("requires_grad")
_POINTER = torch.Tensor.data_ptr
_CALL = weakref.ref.__call__
_REF, _SIGNATURE, _KEY, _DEVICE, _NBYTES_OF = (itemgetter(i) for i in range(5))
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)


class _Gone:
    pass


#: Distinct group keys kept for sharing before the table is emptied (shapes that vary).
_MAX_KEYS = 10_000
#: Devices of plain tensors the general path looks at although not on the census's device.
_ASK = frozenset({"meta", "?"})
#: A memo entry for a tensor never seen: its reference is dead, so it never validates.
_MISSING = (weakref.ref(_Gone()), None, None, "", 0)


class CensusMemo:
    """What the census remembers of plain tensors between calls: ``id -> (weak reference,
    (version, data pointer), (kind, shape, dtype) or None when not simple, device, storage
    bytes)``.
    Holds no tensor; entries of dead tensors are dropped when they outnumber the live."""

    def __init__(self) -> None:
        self.facts: dict[int, tuple[Any, ...]] = {}
        self.last: _Split | None = None
        #: One group key object and one device text per group, shared by its tensors'
        #: entries (an entry then costs about 300 B, its weak reference included).
        self.keys: dict[Any, Any] = {}
        swapguard.hold(self)  # its weak references must not block torch.utils.swap_tensors

    def release(self, tensors: tuple[Any, ...]) -> None:
        """Forget ``tensors`` (before ``torch.utils.swap_tensors``, which refuses a tensor
        with a weak reference; see ``swapguard``): their entries and the last split."""
        for tensor in tensors:
            self.facts.pop(id(tensor), None)
        self.last = None


@dataclass
class Bulk:
    """The simple plain tensors of one census (``tensors``, with their ids, their storages'
    data pointers and sizes in bytes, and their group keys) and the objects left to the
    general path."""

    tensors: list[Any] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    pointers: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    keys: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    others: list[Any] = field(default_factory=list)
    #: Tensors sharing a storage that the bulk resolved itself (the Python bulk moves
    #: every shared storage to the general path: always 0 here).
    views: int = 0
    _members: set[int] | None = field(default=None, repr=False)

    def membership(self) -> set[int]:
        """The ids the bulk counts (made once per census, after ``split``)."""
        if self._members is None:
            self._members = set(self.ids)
        return self._members

    def members(self, ids: list[int]) -> list[bool]:
        """Whether the bulk counts each of ``ids``."""
        return list(map(self.membership().__contains__, ids))

    def settle(self, seen: Any, owners: dict[Any, list[Any]]) -> list[tuple[int, Any]]:
        """``settle`` (module function) for this bulk."""
        return settle(self, seen, owners)

    def add_groups(
        self, seen: Any, groups: dict[tuple[Any, ...], list[Any]], device: str, on_cuda: bool
    ) -> None:
        """``add_groups`` (module function) for this bulk."""
        add_groups(seen, groups, device, on_cuda, self)

    def take_out(self, flags: list[bool]) -> list[Any]:
        """Remove the tensors whose flag is true; return them."""
        keep = list(map(not_, flags))
        taken = list(itertools.compress(self.tensors, flags))
        if self._members is not None:
            self._members.difference_update(map(id, taken))
        self.tensors = list(itertools.compress(self.tensors, keep))
        self.ids = list(itertools.compress(self.ids, keep))
        self.pointers = list(itertools.compress(self.pointers, keep))
        self.nbytes = list(itertools.compress(self.nbytes, keep))
        self.keys = list(itertools.compress(self.keys, keep))
        return taken

    def clear(self) -> None:
        self.tensors.clear()
        self.others.clear()


def split(objects: list[Any], exclude: set[int] | dict[int, Any], device: str, memo: CensusMemo) -> Bulk:
    """Sort ``objects``: simple plain tensors on ``device`` into the bulk, plain tensors on
    other devices (but meta) away, the rest (and tensors whose id is in ``exclude``) into
    ``others``."""
    plain_flags = list(map(_PLAIN.__contains__, map(type, objects)))
    others = list(itertools.compress(objects, map(not_, plain_flags)))
    plain = list(itertools.compress(objects, plain_flags))
    ids = list(map(id, plain))
    if exclude:
        keep = list(map(not_, map(exclude.__contains__, ids)))
        plain, ids = list(itertools.compress(plain, keep)), list(itertools.compress(ids, keep))
    pointers = _read(_POINTER, plain)  # the storage's address, as offsets of simple ones are 0
    versions = _read(_VERSION, plain)  # inference tensors have none
    grads = _read(_REQUIRES_GRAD, plain)
    last = memo.last
    if last is not None and last.same(device, ids, pointers, versions, grads, plain):
        others.extend(itertools.compress(plain, last.general))  # nothing changed: as then
        return Bulk(list(itertools.compress(plain, last.simple)), *last.bulk, others=others)
    entries = _entries(plain, ids, list(zip(versions, pointers)), memo)
    devices = list(map(_DEVICE, entries))
    here = list(map(eq, devices, itertools.repeat(device)))
    has_key = map(is_not, map(_KEY, entries), itertools.repeat(None))
    simple = list(map(and_, map(and_, here, has_key), map(and_, map(not_, grads), map(truth, pointers))))
    # the general path: on the device but not simple, or meta (its bytes are reported skipped)
    general = list(map(or_, map(and_, here, map(not_, simple)), map(_ASK.__contains__, devices)))
    others.extend(itertools.compress(plain, general))
    bulk = (
        list(itertools.compress(ids, simple)),
        list(itertools.compress(pointers, simple)),
        list(itertools.compress(map(_NBYTES_OF, entries), simple)),
        list(itertools.compress(map(_KEY, entries), simple)),
    )
    refs = list(map(_REF, entries))
    memo.last = _Split(device, ids, pointers, versions, grads, refs, simple, general, bulk)
    return Bulk(list(itertools.compress(plain, simple)), *bulk, others=others)


@dataclass
class _Split:
    """The last census's plain tensors (by id, data pointer, version, ``requires_grad`` and
    weak reference) and how they were split: reused while none of these changed."""

    device: str
    ids: list[int]
    pointers: list[Any]
    versions: list[Any]
    grads: list[Any]
    refs: list[Any]
    simple: list[bool]
    general: list[bool]
    bulk: tuple[list[int], list[int], list[int], list[Any]]

    def same(
        self,
        device: str,
        ids: list[int],
        pointers: list[Any],
        versions: list[Any],
        grads: list[Any],
        plain: list[Any],
    ) -> bool:
        """Whether the same tensors, unchanged, in the same order (C-level list compares)."""
        return (
            device == self.device
            and ids == self.ids
            and pointers == self.pointers
            and versions == self.versions
            and grads == self.grads
            and all(map(is_, map(_CALL, self.refs), plain))
        )


def _read(getter: Any, tensors: list[Any]) -> list[Any]:
    """``getter`` of each tensor, None where it raises (a sparse tensor's data pointer)."""
    try:
        return list(map(getter, tensors))
    except Exception:
        return [_safe(getter, tensor) for tensor in tensors]


def _safe(getter: Any, tensor: Any) -> Any:
    try:
        return getter(tensor)
    except Exception:
        return None


def _entries(
    plain: list[Any], ids: list[int], signatures: list[Any], memo: CensusMemo
) -> list[tuple[Any, ...]]:
    """The memo's entry of each tensor, made anew where missing or out of date."""
    facts = memo.facts
    entries = list(map(facts.get, ids, itertools.repeat(_MISSING)))
    valid = map(
        and_,
        map(is_, map(_CALL, map(_REF, entries)), plain),
        map(eq, map(_SIGNATURE, entries), signatures),
    )
    keys = memo.keys
    if len(keys) > _MAX_KEYS:
        keys.clear()
    for index in itertools.compress(range(len(entries)), map(not_, valid)):
        entry = _facts(plain[index], signatures[index])
        # shared: one key and one device text per group, not one per tensor
        entry = (
            entry[0],
            entry[1],
            keys.setdefault(entry[2], entry[2]),
            keys.setdefault(entry[3], entry[3]),
            entry[4],
        )
        entries[index] = facts[ids[index]] = entry
    if len(facts) > 2 * len(ids) + 1024:  # entries of dead tensors outnumber the live
        memo.facts = dict(zip(ids, entries))
    return entries


def _facts(tensor: Any, signature: tuple[Any, Any]) -> tuple[Any, ...]:
    """A memo entry: the tensor's group key when simple (strided, not a view, at the start
    of its storage, with a version counter), else None; its device; its storage's bytes."""
    try:
        device = str(tensor.device)
        if device == "meta":
            return (weakref.ref(tensor), signature, None, device, 0)
        nbytes = tensor.untyped_storage().nbytes()
        simple = (
            tensor.layout is torch.strided
            and tensor._base is None
            and tensor.storage_offset() == 0
            and None not in signature
        )
        key = (_PLAIN[type(tensor)], tuple(tensor.shape), dtype_name(tensor.dtype)) if simple else None
    except Exception:
        return (weakref.ref(tensor), signature, None, "?", 0)  # the general path decides
    return (weakref.ref(tensor), signature, key, device, nbytes)


def settle(bulk: Bulk, seen: Any, owners: dict[Any, list[Any]]) -> list[tuple[int, Any]]:
    """Move to the general path the bulk tensors whose storage another tensor uses (the
    general path's, found in ``owners``, or another bulk tensor's); return them as
    ``(id, tensor)`` for its storage count. Bulk tensors the general path reached itself
    (as relatives) just leave the bulk. Loops run over the general path's few tensors;
    over the bulk only C-level passes."""
    if not bulk.tensors:
        return []
    ids = bulk.membership()
    reached = {tid for tid in seen.tensors if tid in ids}
    pointers = set(bulk.pointers)
    shared = {key for key in owners if key in pointers}
    if len(pointers) != len(bulk.pointers):
        shared.update(pointer for pointer, n in Counter(bulk.pointers).items() if n > 1)
    if not shared and not reached:
        return []
    # one pass takes out both: the reached ones (already the general path's) and the shared
    flags = list(map(shared.__contains__, bulk.pointers))
    if reached:
        flags = list(map(or_, flags, map(reached.__contains__, bulk.ids)))
    # an object the source gave twice is one tensor, not a view of itself
    moved = list({id(t): t for t in bulk.take_out(flags) if id(t) not in reached}.values())
    seen.add_objects(moved)
    return [(id(tensor), tensor) for tensor in moved]


def add_groups(
    seen: Any, groups: dict[tuple[Any, ...], list[Any]], device: str, on_cuda: bool, bulk: Bulk
) -> None:
    """Add the bulk's tensors to ``groups``, counted by (key, bytes) in C; a named tensor's
    key takes the kind the roots gave it (gradient, optimizer state), and its names join its
    group in the order the roots named them (as the general path does)."""
    kinds, names = seen.kinds, seen.names
    counts = Counter(zip(bulk.keys, bulk.nbytes))
    # ids the roots labelled that the bulk still counts (the general path took back some)
    members = bulk.membership()
    labelled = {tid for tid in itertools.chain(names, kinds) if tid in members and tid not in seen.tensors}
    group_of: dict[int, tuple[Any, ...]] = {}
    if labelled:  # move them from their plain group to their kind's
        named = list(map(labelled.__contains__, bulk.ids))
        ids, given = list(itertools.compress(bulk.ids, named)), list(itertools.compress(bulk.keys, named))
        sizes = list(itertools.compress(bulk.nbytes, named))
        counts.subtract(zip(given, sizes))
        relabelled = list(
            zip(map(kinds.get, ids, map(_FIRST, given)), map(_SECOND, given), map(_THIRD, given))
        )
        counts.update(zip(relabelled, sizes))
        group_of = dict(zip(ids, zip(*zip(*relabelled), itertools.repeat(device))))
    for (key, nbytes), count in counts.items():
        if count > 0:
            group = _group(groups, (*key, device))
            group[0] += count
            group[1] += count * (cuda_block_bytes(nbytes) if on_cuda else nbytes)
    for tid in filter(group_of.__contains__, names):
        groups[group_of[tid]][2].extend(names[tid])


def _group(groups: dict[tuple[Any, ...], list[Any]], key: tuple[Any, ...]) -> list[Any]:
    group = groups.get(key)
    if group is None:
        group = groups[key] = [0, 0, []]
    return group
