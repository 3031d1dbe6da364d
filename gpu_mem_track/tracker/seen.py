"""What one census has seen: tensors by id, in discovery order, with their kinds and names.

``Seen`` collects the tensors the roots name (parameters, buffers, optimizer state, named
tensors: ``naming``), the recorder's inputs and saved tensors, the objects the finder gave
that the bulk left to the general path, and their relatives (views' bases, leaves'
gradients). The bulk's tensors are forgotten here once it counts them (their kinds and names
stay, to be joined when grouping). Of several kinds given to one tensor the first in
``records.KINDS`` wins.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .naming import Known, known_tensors
from .records import KINDS

__all__ = ["Seen", "is_tensor_class"]

_RANK = {kind: rank for rank, kind in enumerate(KINDS)}


class Seen:
    """The tensors of one census by id, in discovery order, with known kinds and names."""

    def __init__(self) -> None:
        self.tensors: dict[int, Any] = {}
        self.kinds: dict[int, str] = {}
        self.names: dict[int, list[str]] = {}
        #: The first storage key of each named tensor, to pass a view's names to its owner.
        self.storage_of: dict[int, Any] = {}
        #: Ids of the recorder's aliases of saved tensors (not views in the user's sense).
        self.aliases: set[int] = set()
        #: Ids of the named tensors the bulk counts (``leave_to_bulk``, ``add_relatives``).
        self.bulk: set[int] = set()
        #: Which of some ids the bulk counts (``leave_to_bulk``).
        self.in_bulk: Callable[[list[int]], list[bool]] = lambda ids: [False] * len(ids)

    def add(self, tensor: Any, kind: str | None, name: str | None) -> bool:
        """Add a tensor; of several kinds given for one tensor the first in ``KINDS`` wins."""
        key = id(tensor)
        new = key not in self.tensors
        if new:
            self.tensors[key] = tensor
        self.label(key, kind, name)
        return new

    def label(self, key: int, kind: str | None, name: str | None) -> None:
        """Note a kind and a name for the tensor whose id is ``key``."""
        if kind is not None:
            current = self.kinds.get(key)
            if current is None or _RANK.get(kind, len(KINDS)) < _RANK.get(current, len(KINDS)):
                self.kinds[key] = kind
        if name:
            names = self.names.setdefault(key, [])
            if name not in names:
                names.append(name)

    def add_roots(self, roots: Iterable[tuple[str, Any]]) -> None:
        tensors, kinds, names = self.tensors, self.kinds, self.names
        for known in known_tensors(list(roots)):
            tensor = known.tensor
            if not is_tensor_class(type(tensor)):
                continue
            key = id(tensor)
            if key in tensors or key in kinds or key in names:
                self.add(tensor, known.kind, known.name)
                continue
            tensors[key] = tensor  # first sight (most tensors): ``add`` without its checks
            if known.kind is not None:
                kinds[key] = known.kind
            if known.name:
                names[key] = [known.name]
        known = tensor = None  # type: ignore[assignment]  # drop the last references promptly

    def add_saved(self, known: list[Known]) -> None:
        for item in known:
            if is_tensor_class(type(item.tensor)):
                self.add(item.tensor, item.kind, item.name)
                if item.kind == "Activation":
                    self.aliases.add(id(item.tensor))
        known.clear()  # drop the references promptly

    def add_objects(self, objects: Iterable[Any]) -> None:
        tensors = self.tensors
        for obj in objects:
            if is_tensor_class(type(obj)) and id(obj) not in tensors:
                tensors[id(obj)] = obj

    def leave_to_bulk(self, members: Callable[[list[int]], list[bool]]) -> None:
        """Forget the tensors the bulk counts (their kinds and names stay, for ``_groups``);
        ``members(ids)`` says which ids it counts."""
        tensors = self.tensors
        ids = list(tensors)  # the roots' few, not the bulk's many
        inside = list(itertools.compress(ids, members(ids))) if ids else []
        self.in_bulk = members
        self.bulk = set(inside)
        for tid in inside:
            del tensors[tid]

    def add_relatives(self) -> None:
        """View bases, and leaf gradients (which may exist only in C++ until read), in
        rounds (relatives of relatives), each asking the bulk about its gradients at once."""
        queue = list(self.tensors.values())
        while queue:
            grads: list[tuple[int, Any]] = []
            found: list[Any] = []
            for tensor in queue:
                try:
                    base = tensor._base
                    if base is not None and self.add(base, None, None):
                        found.append(base)
                    if tensor.is_leaf:  # .grad of a non-leaf warns and is always None
                        grad = tensor.grad
                        if grad is not None:
                            grads.append((id(tensor), grad))
                except Exception:
                    continue
            inside = self.in_bulk([id(grad) for _, grad in grads]) if grads else []
            for (tid, grad), counted in zip(grads, inside):
                names = self.names.get(tid)
                name = f"{names[0]}.grad" if names else None
                if counted:  # counted there, named here
                    self.bulk.add(id(grad))
                    self.label(id(grad), "Gradient", name)
                elif self.add(grad, "Gradient", name):
                    found.append(grad)
            queue = found

    def clear(self) -> None:
        self.tensors.clear()
        self.aliases.clear()
        self.bulk.clear()
        self.in_bulk = lambda ids: [False] * len(ids)


_TENSOR_CLASS: dict[type, bool] = {}


def is_tensor_class(cls: type) -> bool:
    """Whether ``cls`` is a tensor class (cached per class)."""
    known = _TENSOR_CLASS.get(cls)
    if known is None:
        known = _TENSOR_CLASS[cls] = issubclass(cls, torch.Tensor)
    return known
