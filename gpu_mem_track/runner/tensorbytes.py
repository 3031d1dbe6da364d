"""``--memory tensors``: the bytes of live CPU tensor storages, and their high-water mark.

A ``TorchDispatchMode`` pushed while the script runs sees every aten op; each CPU storage an
op's outputs hold that is new is counted (its ``nbytes()`` at birth) and followed with a weak
reference to its untyped storage, whose callback subtracts it when it dies (views and
in-place results share a storage and add nothing; following keeps nothing alive). The
high-water mark moves at each birth, so a line's peak is exact, like CUDA's allocated and
peak bytes. Reading is two attribute loads; the cost is in the mode, a Python call per op.

Not counted (see the README's runner section):

- storages made before the sampler starts (torch's own at import): the count starts at 0
  when the run starts, before the script's first line;
- storages made in other threads (dispatch modes are thread-local) or in other processes
  (DataLoader workers); their deaths are not counted either;
- storages no aten op made: ``torch.from_numpy``, ``torch.frombuffer``, ``torch.load``'s
  and unpickled storages, ``UntypedStorage(n)``;
- resizes: a storage counts with its size at birth (``resize_``, ``out=`` into a smaller
  tensor, ``untyped_storage().resize_`` do not change it).

Importing this module imports torch (the runner imports it only for ``--memory tensors``);
nothing here starts CUDA.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..estimator.lifetimes import plain_tensors, tensor_storage
from ..runfolder.records import TENSORS_SOURCE
from .samplers import Extras, RssSampler

__all__ = ["StorageBytes", "TensorSampler"]


class StorageBytes(TorchDispatchMode):
    """Bytes of the live storages on ``device_type`` born while the mode is active
    (``live``), their high-water mark (``peak``) and births plus deaths (``events``)."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.live = 0
        self.peak = 0
        self.events = 0
        self._refs: dict[int, tuple[weakref.ref, int]] = {}  # id(storage): (ref, nbytes)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if type(out) is Tensor:  # most ops: skip flattening the output
            if out.device.type == self.device_type:
                self._count(out)
            return out
        for leaf in plain_tensors(tree_leaves(out)):
            if leaf.device.type == self.device_type:
                self._count(leaf)
        return out

    def _count(self, tensor: Any) -> None:
        storage = tensor_storage(tensor)
        if storage is None:
            return
        key = id(storage)
        entry = self._refs.get(key)
        if entry is not None and entry[0]() is storage:
            return
        nbytes = storage.nbytes()
        self._refs[key] = (weakref.ref(storage, self._on_death(key, nbytes)), nbytes)
        self.events += 1
        self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live

    def _on_death(self, key: int, nbytes: int) -> Callable[[Any], None]:
        def died(ref: Any) -> None:
            entry = self._refs.get(key)
            if entry is not None and entry[0] is ref:
                del self._refs[key]
            self.events += 1
            self.live -= nbytes

        return died

    def forget(self) -> None:
        """Stop following storages: later deaths change nothing."""
        self._refs.clear()


class TensorSampler:
    """The runner's sampler for ``--memory tensors``: ``sample()`` returns the bytes of
    live CPU storages born since construction and their high-water mark (exact peaks).
    Pushes a :class:`StorageBytes` mode on the constructing thread's dispatch-mode stack
    and pops it in :meth:`close`; construct and close it on the thread that runs the
    script. ``events`` counts births plus deaths. ``extras`` reads the RSS."""

    source = TENSORS_SOURCE
    reserved = None

    def __init__(self) -> None:
        self._rss = RssSampler()
        self._mode = StorageBytes()
        self._mode.__enter__()
        self._open = True

    @property
    def events(self) -> int:
        return self._mode.events

    def sample(self) -> tuple[int, int]:
        mode = self._mode
        return mode.live, mode.peak

    def extras(self) -> Extras:
        return None, self._rss.sample()[0] if self._open else None

    def close(self) -> None:
        """Pop the mode (once); later readings stay where they were at close."""
        if not self._open:
            return
        self._open = False
        self._mode.__exit__(None, None, None)
        self._mode.forget()
        self._rss.close()
