"""Storage lifetimes: a dispatch mode that sees every storage born and dying, in order.

Works the same on meta tensors (the estimator's simulated device) and on real tensors.
Each storage is identified by its untyped storage object and followed with a weak
reference, so views and in-place results add nothing and tracking keeps nothing alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

__all__ = ["Lifetimes"]


class Lifetimes(TorchDispatchMode):
    """Records births and deaths of storages on the ``counted`` device types.

    ``size_of(nbytes)`` gives the bytes a storage counts for (the allocator's rounding).
    While active, every op's tensor outputs are registered; tensors made elsewhere are
    registered with :meth:`adopt`. ``phase`` and ``modules`` (a stack of module names)
    are set by the caller and stamped on births and on the peak. ``peak`` and
    ``phase_peaks`` cover the time since :meth:`start_measuring`. Call :meth:`close`
    when done: it drops the weak references, so later deaths change nothing.
    """

    def __init__(self, counted: Iterable[str], size_of: Callable[[int], int]) -> None:
        super().__init__()
        self.counted = frozenset(counted)
        self.size_of = size_of
        self.phase = "setup"
        self.modules: list[str] = []
        self.sizes: list[int] = []  # per key: counted bytes
        self.elements: list[int] = []  # per key: elements at birth
        self.born_in: list[tuple[str, str]] = []  # per key: (phase, module)
        self.events: list[tuple[int, int]] = []  # (key, +1 birth / -1 death)
        self.live = 0
        self.peak = 0
        self.peak_event = 0
        self.phase_peaks: dict[str, tuple[int, str, str]] = {}
        self._refs: dict[int, tuple[int, weakref.ref]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        grew = False
        for leaf in _plain_tensors(tree_leaves(out)):
            grew |= self._register(leaf) is not None
        if grew:
            self._note_peak(str(func.overloadpacket.__name__))
        return out

    def adopt(self, tensor: torch.Tensor) -> int | None:
        """Register ``tensor``'s storage if new; its key (``None`` if not counted)."""
        if is_traceable_wrapper_subclass(tensor):
            keys = [self.adopt(inner) for inner in _plain_tensors([tensor])]
            return keys[0] if len(keys) == 1 else None
        key = self.key_of(tensor)
        if key is None:
            key = self._register(tensor)
            if key is not None:
                self._note_peak("")
        return key

    def key_of(self, tensor: torch.Tensor) -> int | None:
        """The key of ``tensor``'s storage when it is registered and alive, else ``None``."""
        storage = _storage(tensor)
        entry = self._refs.get(id(storage)) if storage is not None else None
        return entry[0] if entry is not None and entry[1]() is storage else None

    def live_keys(self, until: int | None = None) -> set[int]:
        """Keys alive after the first ``until`` events (all events when ``None``)."""
        alive: set[int] = set()
        for key, change in self.events[:until]:
            (alive.add if change > 0 else alive.discard)(key)
        return alive

    def resized(self, tensor: torch.Tensor) -> None:
        """Note that ``tensor``'s storage was resized in place (``untyped_storage().resize_``,
        which no dispatch mode sees; FSDP2 frees and re-allocates its unsharded parameters
        so). Counted as the death of the old size and, unless now empty, a birth."""
        storage = _storage(tensor)
        entry = self._refs.pop(id(storage), None) if storage is not None else None
        if entry is not None and entry[1]() is storage:
            self.events.append((entry[0], -1))  # dropping the weakref drops its callback
            self.live -= self.sizes[entry[0]]
        if storage is not None and storage.nbytes() > 0 and self._register(tensor) is not None:
            self._note_peak("resize_")

    def start_measuring(self) -> None:
        """Restart ``peak`` and ``phase_peaks`` (the current phase's) from the bytes live now."""
        self.peak = self.live
        self.peak_event = len(self.events)
        self.phase_peaks = {self.phase: (self.live, "", "")}

    def close(self) -> None:
        """Stop following storages (their deaths are no longer recorded)."""
        self._refs.clear()

    def _register(self, tensor: torch.Tensor) -> int | None:
        if tensor.device.type not in self.counted:
            return None
        storage = _storage(tensor)
        if storage is None:
            return None
        entry = self._refs.get(id(storage))
        if entry is not None and entry[1]() is storage:
            return None
        key = len(self.sizes)
        size = self.size_of(storage.nbytes())
        self.sizes.append(size)
        self.elements.append(storage.nbytes() // max(tensor.element_size(), 1))
        self.born_in.append((self.phase, self.modules[-1] if self.modules else ""))
        self._refs[id(storage)] = (key, weakref.ref(storage, self._on_death(key, id(storage))))
        self.events.append((key, 1))
        self.live += size
        return key

    def _on_death(self, key: int, storage_id: int) -> Callable[[Any], None]:
        def died(_: Any) -> None:
            entry = self._refs.get(storage_id)
            if entry is not None and entry[0] == key:
                del self._refs[storage_id]
            self.events.append((key, -1))
            self.live -= self.sizes[key]

        return died

    def _note_peak(self, op: str) -> None:
        module = self.modules[-1] if self.modules else ""
        best = self.phase_peaks.get(self.phase)
        if best is None or self.live > best[0]:
            self.phase_peaks[self.phase] = (self.live, op, module)
        if self.live > self.peak:
            self.peak = self.live
            self.peak_event = len(self.events)


def _plain_tensors(leaves: Iterable[Any]) -> Iterator[torch.Tensor]:
    """The tensors among ``leaves``; a wrapper subclass (DTensor) gives its inner tensors,
    made inside its own dispatch where this mode does not see them."""
    for leaf in leaves:
        if is_traceable_wrapper_subclass(leaf):
            names, _ = leaf.__tensor_flatten__()
            yield from _plain_tensors(getattr(leaf, name) for name in names)
        elif isinstance(leaf, torch.Tensor):
            yield leaf


def _storage(tensor: torch.Tensor) -> Any:
    if is_traceable_wrapper_subclass(tensor):
        return None  # a DTensor's storage is its local tensor's, counted when that is made
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # sparse and wrapper tensors have no single storage
