"""The census's bulk read by the native reader (``gpu_mem_track.native``'s ``census_scan``),
and ``read_bulk``, which picks the reader for one census.

The same part of the census as ``bulk`` (plain tensors: exactly ``torch.Tensor`` or
``nn.Parameter``), read in one C++ pass instead of several attribute reads each, and
counted there: each storage's bytes once, grouped by kind, shape, dtype and bytes.
What it takes in that ``bulk`` leaves to the general path: views whose base it reads too
(the base owns the storage, each view counts as one in ``views``), tensors not at the
start of their storage, inference tensors, tensors requiring grad, and the gradients of
leaves (which may exist only in C++) when dense and alone on their storage: kind
``Gradient``, named ``<leaf's name>.grad``. What it leaves to the general path: every other
class, meta and sparse tensors, leaves with another gradient (the general path reads
``.grad``), tensors without a storage or at a null address, and, when settled, every
tensor of a storage that a general-path tensor uses, that the program names while another
tensor owns it, or that holds a view whose base is not among the objects.

Kinds and names the roots give (gradients, optimizer state, a variable's name) are
joined when grouping, as ``bulk.add_groups`` does. Nothing is remembered between
censuses: each costs a few ns per tensor, so no memo is needed.
"""

from __future__ import annotations

import itertools
from types import ModuleType
from typing import Any

import torch

from .. import native
from ..dtypes import dtype_name
from ..units import cuda_block_bytes
from .bulk import Bulk, CensusMemo, split
from .records import KINDS

__all__ = ["NativeBulk", "read_bulk"]

_KIND = {kind: rank for rank, kind in enumerate(KINDS)}
#: What ``groups`` is told of a tensor named by the roots without a kind: keep its class's.
_NAMED = -2


class NativeBulk:
    """The plain tensors of one census, read natively; the rest in ``others``."""

    def __init__(self, reader: ModuleType, objects: list[Any], exclude: set[int], device: str) -> None:
        self._scan = reader.Scan(
            objects, torch.Tensor, torch.nn.Parameter, device, exclude or None, _KIND["Gradient"]
        )
        self._objects = objects
        self.others: list[Any] = list(itertools.compress(objects, self._scan.general()))
        self.views = 0

    def members(self, ids: list[int]) -> list[bool]:
        """Whether the bulk counts each of ``ids`` (one pass over the bulk: ask in batches)."""
        return list(self._scan.lookup(ids))

    def settle(self, seen: Any, owners: dict[Any, list[Any]]) -> list[tuple[int, Any]]:
        """Give the general path the bulk's tensors whose storage it must rank (see the
        module doc); return them as ``(id, tensor)``. Tensors the general path reached
        itself (as bases or gradients) just leave the bulk."""
        tensors = list(seen.tensors)
        reached = list(itertools.compress(tensors, self._scan.lookup(tensors)))
        labelled = set(itertools.chain(seen.names, seen.kinds))
        moved = [self._objects[index] for index in self._scan.settle(owners.keys(), reached, labelled)]
        self.views = self._scan.views
        seen.add_objects(moved)
        for leaf, grad in self._scan.gradients():  # a leaf's gradient among the objects
            names = seen.names.get(id(self._objects[leaf]))
            seen.label(id(self._objects[grad]), "Gradient", f"{names[0]}.grad" if names else None)
        return [(id(tensor), tensor) for tensor in moved]

    def add_groups(
        self, seen: Any, groups: dict[tuple[Any, ...], list[Any]], device: str, on_cuda: bool
    ) -> None:
        """Add the bulk's storages to ``groups``; a named tensor's group takes the kind the
        roots gave it, and its names, in the order the roots named them."""
        kinds, names, tensors = seen.kinds, seen.names, seen.tensors
        given = {tid: _KIND.get(kind, _NAMED) for tid, kind in kinds.items() if tid not in tensors}
        for tid in names:
            if tid not in tensors:
                given.setdefault(tid, _NAMED)
        entries, where, gradients = self._scan.groups(_KIND["Tensor"], _KIND["Parameter"], given)
        keys = []
        for first, kind, shape, nbytes, count in entries:
            key = (KINDS[kind], shape, dtype_name(self._objects[first].dtype), device)
            group = groups.get(key)
            if group is None:
                group = groups[key] = [0, 0, []]
            group[0] += count
            group[1] += count * (cuda_block_bytes(nbytes) if on_cuda else nbytes)
            keys.append(key)
        for tid in names:
            entry = where.get(tid)
            if entry is not None:
                groups[keys[entry]][2].extend(names[tid])
            entry = gradients.get(tid)  # the gradient of a named leaf, counted without an object
            if entry is not None:
                groups[keys[entry]][2].append(f"{names[tid][0]}.grad")

    def clear(self) -> None:
        self._objects = []
        self.others.clear()


def read_bulk(
    objects: list[Any], aliases: set[int], device: str, memo: CensusMemo | None
) -> Bulk | NativeBulk:
    """The bulk of one census: read by the native reader when it is loaded and no torch
    function mode could answer attribute reads its own way (the simulated GPU's does),
    else through Python (``bulk.split``), which asks for the reader to be built once a
    census meets ``native.AUTO_BUILD_TENSORS`` objects."""
    reader = native.census_scan() if not _function_modes() else None
    if reader is not None:
        try:
            return NativeBulk(reader, objects, aliases, device)
        except Exception:  # a device text torch's C++ does not parse: the Python path reads it
            pass
    elif len(objects) >= native.AUTO_BUILD_TENSORS:
        native.request_build()
    return split(objects, aliases, device, memo or CensusMemo())


def _function_modes() -> bool:
    """Whether a torch function mode may be active (True when this torch cannot say)."""
    enabled = getattr(torch._C, "_is_torch_function_mode_enabled", None)
    return True if enabled is None else bool(enabled())
