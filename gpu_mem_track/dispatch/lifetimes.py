"""Storage lifetimes: a dispatch mode that sees every storage born and dying, in order.

Works the same on meta tensors (the estimator's simulated device) and on real tensors.
Each storage is identified by its untyped storage object and followed with a weak
reference, so views and in-place results add nothing and tracking keeps nothing alive.
Each storage born is taken from a device memory (``memory``: exact sizes, or the
simulated GPU's caching allocator, see :mod:`~gpu_mem_track.dispatch.memory`) and given back
when it dies; the cuBLAS workspaces are taken at the first matmul-like op of each
handle and never given back. In backward, the gradient sums and formula scatters that
autograd makes out of place only because a dispatch mode is on run in place, as without
the mode (:mod:`~gpu_mem_track.gpumodel.accumulate`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from ..gpumodel.accumulate import InPlaceSums
from .memory import CublasWorkspace, ExactMemory, StorageMemory

__all__ = ["Lifetimes", "plain_tensors", "tensor_leaves", "tensor_storage"]

#: ``born_in`` phase of the cuBLAS workspaces' keys.
WORKSPACE = "cuBLAS workspace"


class Lifetimes(TorchDispatchMode):
    """Records births and deaths of storages on the ``counted`` device types.

    ``memory`` (an ``ExactMemory`` or the simulated GPU's ``GpuMemory``) gives the bytes a storage
    counts for and, for the caching allocator, the reserved bytes; ``workspace`` (None:
    not modelled) the cuBLAS workspaces. While active, every op's tensor outputs are
    registered; tensors made elsewhere are registered with :meth:`adopt`. ``phase`` and
    ``modules`` (a stack of module names) are set by the caller and stamped on births
    and on the peak; with ``detect_backward`` the phase reads ``"backward"`` while
    autograd runs a backward pass. ``peak`` (allocated bytes), ``reserved_peak`` and
    ``phase_peaks`` cover the time since :meth:`start_measuring`; ``peak_reserved`` and
    ``peak_free_block`` are the reserved bytes and the largest free cached block at the
    moment of ``peak``. Without ``history`` only the live storages are remembered (no
    ``events``, ``sizes``, ``born_in``), so memory stays bounded however long the run.
    Call :meth:`close` when done: it drops the weak references, so later deaths change
    nothing.
    """

    def __init__(
        self,
        counted: Iterable[str],
        memory: StorageMemory | None = None,
        workspace: CublasWorkspace | None = None,
        history: bool = True,
    ) -> None:
        super().__init__()
        self.history = history
        self._alive: dict[int, tuple[int, int]] = {}  # without history: key -> (bytes, handle)
        self._keys = 0
        self.counted = frozenset(counted)
        self.memory = memory if memory is not None else ExactMemory()
        self.workspace = workspace
        self.workspace_keys: set[int] = set()
        self.detect_backward = False
        self.phase = "setup"
        self.modules: list[str] = []
        self.sizes: list[int] = []  # per key: counted bytes
        self.elements: list[int] = []  # per key: elements at birth
        self.born_in: list[tuple[str, str]] = []  # per key: (phase, module)
        self.events: list[tuple[int, int]] = []  # (key, +1 birth / -1 death)
        self.handles: list[int] = []  # per key: the memory's handle
        self.live = 0
        self.peak = 0
        self.peak_event = 0
        self.reserved_peak = 0
        self.peak_reserved = 0
        self.peak_free_block = 0
        self.phase_peaks: dict[str, tuple[int, str, str]] = {}
        self._refs: dict[int, tuple[int, weakref.ref]] = {}
        self.sums = InPlaceSums()
        self._node: tuple[int, int] | None = None  # the autograd node running: (task, sequence)
        self._node_born: set[int] = set()  # keys of the storages it made

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        task = torch._C._current_graph_task_id()
        run = None
        if task != -1:
            self._enter_node(task)
            run = self.sums.in_place(func, args, kwargs, self._born_here)
        out = run() if run is not None else func(*args, **(kwargs or {}))
        grew = False
        counted = False
        for leaf in plain_tensors(tensor_leaves(out)):
            key = self._register(leaf)
            if key is not None:
                grew = True
                if task != -1:
                    self._node_born.add(key)
            counted |= _device_type(leaf) in self.counted
        if counted and self.workspace is not None:
            grew |= self._take_workspace(str(func.overloadpacket.__name__))
        if grew:
            self._note_peak(str(func.overloadpacket.__name__))
        if task != -1:
            self.sums.saw(func, out)
        return out

    def _enter_node(self, task: int) -> None:
        """Follow which autograd node runs (its births, for ``_born_here``)."""
        node = torch._C._current_autograd_node()
        ident = (task, node._sequence_nr() if node is not None else -1)
        if ident != self._node:
            self._node = ident
            self._node_born.clear()

    def _born_here(self, tensor: torch.Tensor) -> bool:
        return self.key_of(tensor) in self._node_born

    def adopt(self, tensor: torch.Tensor) -> int | None:
        """Register ``tensor``'s storage if new; its key (``None`` if not counted)."""
        if is_traceable_wrapper_subclass(tensor):
            keys = [self.adopt(inner) for inner in plain_tensors([tensor])]
            return keys[0] if len(keys) == 1 else None
        key = self.key_of(tensor)
        if key is None:
            key = self._register(tensor)
            if key is not None:
                self._note_peak("")
        return key

    def key_of(self, tensor: torch.Tensor) -> int | None:
        """The key of ``tensor``'s storage when it is registered and alive, else ``None``."""
        storage = tensor_storage(tensor)
        entry = self._refs.get(id(storage)) if storage is not None else None
        return entry[0] if entry is not None and entry[1]() is storage else None

    @property
    def followed(self) -> int:
        """How many storages are followed now (alive and counted)."""
        return len(self._refs)

    def module(self) -> str:
        """The innermost module running, ``"(model)"`` for the root (``""`` outside forward)."""
        return (self.modules[-1] or "(model)") if self.modules else ""

    def live_keys(self, until: int | None = None) -> set[int]:
        """Keys alive after the first ``until`` events (all events when ``None``)."""
        alive: set[int] = set()
        for key, change in self.events[:until]:
            (alive.add if change > 0 else alive.discard)(key)
        return alive

    def resized(self, tensor: torch.Tensor) -> None:
        """Note that ``tensor``'s storage was resized in place (``untyped_storage().resize_``,
        which no dispatch mode sees; FSDP2 frees and re-allocates its unsharded parameters
        so). Counted as the death of the old size (its block given back to ``memory``)
        and, unless now empty, a birth."""
        storage = tensor_storage(tensor)
        entry = self._refs.pop(id(storage), None) if storage is not None else None
        if entry is not None and entry[1]() is storage:
            self._release(entry[0])  # dropping the weakref drops its callback
        if storage is not None and storage.nbytes() > 0 and self._register(tensor) is not None:
            self._note_peak("resize_")

    def current_phase(self) -> str:
        """``phase``, or ``"backward"`` inside a backward pass when ``detect_backward``."""
        if self.detect_backward and torch._C._current_graph_task_id() != -1:
            return "backward"
        return self.phase

    def start_measuring(self) -> None:
        """Restart the peaks and ``phase_peaks`` (the current phase's) from the bytes live now."""
        self.peak = self.live
        self.peak_event = len(self.events)
        self.reserved_peak = self.peak_reserved = self.memory.reserved
        self.peak_free_block = self.memory.largest_free_block()
        self.phase_peaks = {self.current_phase(): (self.live, "", "")}

    def close(self) -> None:
        """Stop following storages (their deaths are no longer recorded)."""
        self._refs.clear()

    def _register(self, tensor: torch.Tensor) -> int | None:
        if _device_type(tensor) not in self.counted:
            return None
        storage = tensor_storage(tensor)
        if storage is None:
            return None
        entry = self._refs.get(id(storage))
        if entry is not None and entry[1]() is storage:
            return None
        key = self._new_key(storage.nbytes(), storage.nbytes() // max(tensor.element_size(), 1))
        self._refs[id(storage)] = (key, weakref.ref(storage, self._on_death(key, id(storage))))
        return key

    def _new_key(self, nbytes: int, elements: int, phase: str | None = None) -> int:
        handle, size = self.memory.take(nbytes)
        if not self.history:
            key, self._keys = self._keys, self._keys + 1
            self._alive[key] = (size, handle)
            self.live += size
            return key
        key = len(self.sizes)
        self.sizes.append(size)
        self.handles.append(handle)
        self.elements.append(elements)
        self.born_in.append((phase or self.current_phase(), self.modules[-1] if self.modules else ""))
        self.events.append((key, 1))
        self.live += size
        return key

    def _take_workspace(self, op: str) -> bool:
        in_backward = torch._C._current_graph_task_id() != -1
        handle = self.workspace.needed(op, in_backward)
        if handle is None:
            return False
        key = self._new_key(self.workspace.nbytes, 0, WORKSPACE)
        self.workspace.blocks[handle] = self.sizes[key] if self.history else self._alive[key][0]
        self.workspace_keys.add(key)
        return True

    def _on_death(self, key: int, storage_id: int) -> Callable[[Any], None]:
        def died(_: Any) -> None:
            entry = self._refs.get(storage_id)
            if entry is not None and entry[0] == key:
                del self._refs[storage_id]
            self._release(key)

        return died

    def _release(self, key: int) -> None:
        """The storage ``key`` died: its bytes leave ``live`` and its block goes back."""
        if self.history:
            self.events.append((key, -1))
            size, handle = self.sizes[key], self.handles[key]
        else:
            size, handle = self._alive.pop(key)
        self.live -= size
        self.memory.give_back(handle)

    def _note_peak(self, op: str) -> None:
        module = self.modules[-1] if self.modules else ""
        phase = self.current_phase()
        best = self.phase_peaks.get(phase)
        if best is None or self.live > best[0]:
            self.phase_peaks[phase] = (self.live, op, module)
        reserved = self.memory.reserved
        self.reserved_peak = max(self.reserved_peak, reserved)
        if self.live > self.peak:
            self.peak = self.live
            self.peak_event = len(self.events)
            self.peak_reserved = reserved
            self.peak_free_block = self.memory.largest_free_block()


def _device_type(tensor: torch.Tensor) -> str:
    """The device type ``tensor`` is on, not the one a torch-function mode says (the
    simulated GPU's face says ``cuda`` for its meta tensors)."""
    with torch._C.DisableTorchFunction():
        return tensor.device.type


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors in ``tree`` (tensors, and lists, tuples and dicts of them, as op
    arguments and outputs are), left to right; a faster ``tree_leaves`` for these."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    found: list[torch.Tensor] = []
    if isinstance(tree, (list, tuple, dict)):
        _collect(tree, found)
    return found


def _collect(tree: Any, found: list[torch.Tensor]) -> None:
    for item in tree.values() if isinstance(tree, dict) else tree:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple, dict)):
            _collect(item, found)


def plain_tensors(leaves: Iterable[Any]) -> Iterator[torch.Tensor]:
    """The tensors among ``leaves``; a wrapper subclass (DTensor) gives its inner tensors,
    made inside its own dispatch where this mode does not see them."""
    for leaf in leaves:
        if is_traceable_wrapper_subclass(leaf):
            names, _ = leaf.__tensor_flatten__()
            yield from plain_tensors(getattr(leaf, name) for name in names)
        elif isinstance(leaf, torch.Tensor):
            yield leaf


def tensor_storage(tensor: torch.Tensor) -> Any:
    """``tensor``'s untyped storage, or None when it has no single one of its own (a
    wrapper subclass such as DTensor, a sparse tensor)."""
    if is_traceable_wrapper_subclass(tensor):
        return None  # a DTensor's storage is its local tensor's, counted when that is made
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # sparse and wrapper tensors have no single storage
