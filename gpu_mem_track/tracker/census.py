"""The live-tensor census: find every tensor, count each storage once, group them.

Finding the tensors (and the models and optimizers that own them) is ``finder``'s job:
``LiveTensorFinder`` (the fast default) and ``full_scan`` (exhaustive, slower, to check
the fast one) live there and are re-exported here.

``take_census`` then adds what the finder cannot see or name: tensors of watched and
discovered modules and optimizers, the bases of views, the gradients of leaf tensors
(a ``.grad`` Python never touched exists only in C++ until read), and the inputs and
saved-for-backward tensors a ``saved.SavedTensorRecorder`` recorded (otherwise only C++
autograd nodes hold them).

Two paths count storages. Plain tensors (most of a big program's: parameters, gradients,
optimizer state, activations kept around) go through the bulk: read by the native reader
in one C++ pass when it is built (``nativebulk``, see ``gpu_mem_track.native``; views
whose base it read too, storages shared among them and leaves' simple gradients are
settled there), else in C-level Python passes, what they are remembered between censuses
(``bulk``: only tensors owning their storage alone and needing no ``.grad`` read). The
kinds and names the roots give them are kept in ``seen.Seen`` and joined when grouping. Every
other tensor goes through the general path (``_Storages``: owners by rank, views, names).
The recorder's aliases of saved tensors always take the general path. Both bulks count
the same.

A distributed tensor (``torch.distributed.tensor.DTensor``: FSDP2's parameters, their
gradients and optimizer state) counts as its local shard (``_local_tensor``), the bytes
on this rank, with the local shard's shape: the DTensor itself has no storage of its own
(its shape is the global one), and its shard, which the finder also sees, is the same
storage, counted once under the DTensor's kind and name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from ..devices import parse_device
from ..dtensors import local_shard
from ..dtypes import dtype_name
from ..units import cuda_block_bytes
from .bulk import Bulk, CensusMemo
from .finder import FullScan, LiveTensorFinder, full_scan, tensor_types
from .nativebulk import NativeBulk, read_bulk
from .records import KINDS, Census, Skipped, TensorGroup
from .seen import Seen

if TYPE_CHECKING:
    from .saved import SavedTensorRecorder

__all__ = ["FullScan", "LiveTensorFinder", "TensorSource", "full_scan", "take_census", "tensor_types"]

#: A callable returning candidate objects; the census keeps the tensors among them.
TensorSource = Callable[[], Iterable[Any]]

_RANK = {kind: rank for rank, kind in enumerate(KINDS)}
_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}


def take_census(
    device: str,
    source: TensorSource,
    roots: Iterable[tuple[str, Any]] = (),
    saved: SavedTensorRecorder | None = None,
    memo: CensusMemo | None = None,
    unique: bool | None = None,
) -> Census:
    """Count the storages of live tensors on ``device`` (``"cpu"``, ``"cuda:0"``, ...).

    ``source`` supplies candidate objects (``LiveTensorFinder()``, ``full_scan`` or, in
    tests, a list); non-tensors among them are ignored. ``roots`` (see ``naming``) name
    tensors and give their kind. ``saved`` adds the inputs and saved activations it
    recorded, kinds ``Input`` and ``Activation``. Each storage is counted once, for the
    tensor that owns it most plausibly: by kind in ``KINDS`` order (a parameter before a
    saved activation before a plain tensor), then a base before its views; but a storage
    a plain tensor with a program name uses (``roots``) is never an Activation. A saved
    tensor's alias sharing a visible tensor's storage is not counted as a view.
    CUDA storages count as the allocator's 512 B-rounded blocks. Meta and fake tensors,
    and tensors without an accessible storage, are reported in ``skipped`` instead.
    No tensor is referenced once this returns. ``memo``: what a previous census learnt of
    plain tensors (``bulk.CensusMemo``; pass the same one each time to make censuses of
    many unchanged tensors cheap). ``unique``: the source gives each object once (None:
    known of ``LiveTensorFinder``, ``FullScan`` and ``full_scan``; a repeat of another
    source's is dropped, so an object is never counted twice).
    """
    target = torch.device(str(parse_device(device)))
    seen = Seen()
    # Attribute reads must not run tensor subclasses' __torch_function__ (user code).
    with torch._C.DisableTorchFunctionSubclass():
        seen.add_roots(roots)
        if saved is not None:
            seen.add_saved(saved.known_tensors())
        # named tensors go through the bulk too (their kinds and names kept in ``seen``),
        # but not the recorder's aliases of saved tensors (who owns their storage is ranked)
        objects = list(source())
        if not (unique if unique is not None else _distinct(source)):
            objects = list({id(obj): obj for obj in objects}.values())
        bulk = read_bulk(objects, seen.aliases, str(target), memo)
        del objects
        seen.leave_to_bulk(bulk.members)
        seen.add_objects(bulk.others)
        seen.add_relatives()
        storages = _Storages(seen, target)
        storages.add(seen.tensors.items())
        storages.add(bulk.settle(seen, storages.owners))
        owners, skipped, views = storages.result()
        views += bulk.views
        groups = _groups(seen, owners, str(target), target.type == "cuda", bulk)
    seen.clear()
    bulk.clear()
    return Census(
        device=str(target),
        groups=groups,
        views=views,
        skipped=tuple(Skipped(r, c, b) for r, (c, b) in sorted(skipped.items())),
    )


def _distinct(source: TensorSource) -> bool:
    """Whether ``source`` is one of ours that gives each object once."""
    return source is full_scan or isinstance(source, (LiveTensorFinder, FullScan))


_CLASS_KIND: dict[type, str | None] = {}


def _class_kind(cls: type) -> str | None:
    """``"Parameter"``, ``"Buffer"``, ``"Tensor"``, or None for fake tensors (cached per class)."""
    if cls not in _CLASS_KIND:
        fake_module = sys.modules.get("torch._subclasses.fake_tensor")
        fake = getattr(fake_module, "FakeTensor", None)
        buffer = getattr(torch.nn, "Buffer", None)
        if fake is not None and issubclass(cls, fake):
            _CLASS_KIND[cls] = None
        elif issubclass(cls, torch.nn.Parameter):
            _CLASS_KIND[cls] = "Parameter"
        elif buffer is not None and issubclass(cls, buffer):
            _CLASS_KIND[cls] = "Buffer"
        else:
            _CLASS_KIND[cls] = "Tensor"
    return _CLASS_KIND[cls]


class _Storages:
    """Each storage on ``target`` mapped to its owner: ``key -> [rank, id, nbytes, tensor,
    order]``, filled by ``add`` (in discovery order, in one or more calls).

    The owner is the best-ranked tensor using the storage (see ``_rank``); ranks are
    computed only where two tensors share a storage, so ``rank`` is None until then.
    A storage the program holds under a name (a plain tensor bound in the calling code
    or watched) is never an activation: a saved tensor's alias owns only storages nothing
    else names (``result``). So a batch sliced from a dataset and saved for backward leaves
    the dataset in its own category (named ``train_data, saved at ...``).
    """

    def __init__(self, seen: Seen, target: torch.device) -> None:
        self.seen, self.target = seen, target
        self.owners: dict[Any, list[Any]] = {}
        self.plain: dict[Any, list[Any]] = {}  # shared storages: the best owner not a saved alias
        self.named: set[Any] = set()  # storages a plain tensor with a program name uses
        self.skipped: dict[str, list[int]] = {}
        self.views = 0
        self.order = 0
        self.shards: set[int] = set()  # the ids of DTensors' local shards (not views of them)

    def add(self, items: Iterable[tuple[int, Any]]) -> None:
        seen, skipped = self.seen, self.skipped
        for tid, tensor in items:
            self.order += 1
            try:
                cls_kind = _class_kind(type(tensor))
                local = local_shard(tensor)
                if local is not tensor:
                    self.shards.add(id(local))
                    if getattr(tensor, "_is_param", False):  # nn.Parameter(DTensor) keeps its class
                        cls_kind = "Parameter"
                device = local.device
                if cls_kind is None or device.type == "meta":
                    _tally(skipped, "fake" if cls_kind is None else "meta", _nominal_bytes(local))
                    continue
                if device != self.target:
                    continue
                parts = _storage_parts(local)
            except Exception:
                _tally(skipped, "no storage", 0)
                continue
            kind = seen.kinds.setdefault(tid, cls_kind)
            if tid in seen.names and parts:
                seen.storage_of[tid] = parts[0][0]
                if kind == "Tensor" and tid not in seen.aliases:
                    self.named.update(key for key, _ in parts)
            for key, nbytes in parts:
                self._own(key, nbytes, tid, tensor)

    def _own(self, key: Any, nbytes: int, tid: int, tensor: Any) -> None:
        seen, owners, plain, order = self.seen, self.owners, self.plain, self.order
        current = owners.get(key)
        if current is None:
            owners[key] = [None, tid, nbytes, tensor, order]
            return
        holders = (tid, current[1])  # a saved alias or a DTensor's shard is no view
        if not any(h in seen.aliases or h in self.shards for h in holders):
            self.views += 1
        if current[0] is None:
            current[0] = _rank(seen, current[1], current[3], current[4])
            if current[1] not in seen.aliases:
                plain[key] = list(current)
        rank = _rank(seen, tid, tensor, order)
        if tid not in seen.aliases and (key not in plain or rank < plain[key][0]):
            plain[key] = [rank, tid, nbytes, tensor, order]
        if rank < current[0]:
            current[0], current[1], current[3], current[4] = rank, tid, tensor, order

    def result(self) -> tuple[dict[Any, list[Any]], dict[str, list[int]], int]:
        """(owners, skipped ``reason -> [count, nominal bytes]``, views)."""
        for key in self.named.intersection(self.plain):
            if self.owners[key][1] in self.seen.aliases:
                self.owners[key] = self.plain[key]
        return self.owners, self.skipped, self.views


def _rank(seen: Seen, tid: int, tensor: Any, order: int) -> tuple[int, bool, int, int]:
    """Who owns a shared storage, lowest first: by kind (a parameter before a plain alias),
    then a base before a view (``expand`` views are larger but own nothing), then the
    larger tensor, then the first found."""
    kind_rank = _RANK.get(seen.kinds[tid], len(KINDS))
    try:
        return (kind_rank, tensor._base is not None, -tensor.numel(), order)
    except Exception:
        return (kind_rank, True, 0, order)


def _tally(skipped: dict[str, list[int]], reason: str, nbytes: int) -> None:
    entry = skipped.setdefault(reason, [0, 0])
    entry[0] += 1
    entry[1] += nbytes


def _groups(
    seen: Seen, owners: dict[Any, list[Any]], device: str, on_cuda: bool, bulk: Bulk | NativeBulk
) -> tuple[TensorGroup, ...]:
    """Group owned storages by (kind, shape, dtype), the bulk's included; views' names go
    to their storage's owner."""
    per_tensor: dict[int, int] = {}
    for owner in owners.values():
        nbytes = cuda_block_bytes(owner[2]) if on_cuda else owner[2]
        per_tensor[owner[1]] = per_tensor.get(owner[1], 0) + nbytes
    _pass_view_names(seen, owners, per_tensor)
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for tid, nbytes in per_tensor.items():
        tensor = seen.tensors[tid]
        try:
            tensor = local_shard(tensor)  # a DTensor's bytes are its shard's, of the shard's shape
            dtype = tensor.dtype
            shape = tuple(tensor.shape)
        except Exception:  # a subclass whose metadata raises: count it, shapeless
            dtype, shape = None, ()
        key = (seen.kinds[tid], shape, dtype_name(dtype), device)
        group = groups.get(key)
        if group is None:
            group = groups[key] = [0, 0, []]
        group[0] += 1
        group[1] += nbytes
        group[2].extend(seen.names.get(tid, ()))
    bulk.add_groups(seen, groups, device, on_cuda)
    result = [
        TensorGroup(*key, count=count, nbytes=nbytes, names=tuple(dict.fromkeys(names)))
        for key, (count, nbytes, names) in groups.items()
    ]
    result.sort(key=lambda g: (_RANK.get(g.kind, len(KINDS)), -g.nbytes, g.shape, g.dtype))
    return tuple(result)


def _pass_view_names(seen: Seen, owners: dict[Any, list[Any]], per_tensor: dict[int, int]) -> None:
    """Name a storage's owner after its views too (``v (view)``), so a slice kept after its
    base was deleted is still found by its variable name. Where a saved activation's
    alias is the owner or the named tensor, names pass as they are (``out``,
    ``saved at train.py:42 (fc1)``), unless the named tensor is a view."""
    for tid, key in seen.storage_of.items():
        if tid in per_tensor:
            continue
        owner = owners.get(key)
        if owner is not None:
            saved = owner[1] in seen.aliases or tid in seen.aliases
            suffix = " (view)" if not saved or _is_view(seen.tensors[tid]) else ""
            owner_names = seen.names.setdefault(owner[1], [])
            owner_names.extend(f"{n}{suffix}" for n in seen.names[tid] if f"{n}{suffix}" not in owner_names)


def _is_view(tensor: Any) -> bool:
    try:
        return tensor._base is not None
    except Exception:
        return True


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
    return [(pointer if pointer else ("impl", storage._cdata), storage.nbytes())]


def _nominal_bytes(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().nbytes())
    except Exception:
        try:
            return int(tensor.numel() * tensor.element_size())
        except Exception:
            return 0
