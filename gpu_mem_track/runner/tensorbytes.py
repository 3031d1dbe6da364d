"""``--memory tensors``: the bytes of live CPU tensor storages, and their high-water mark.

A ``TorchDispatchMode`` pushed while the script runs sees every aten op; each CPU storage an
op's outputs hold that is new is counted (its ``nbytes()`` at birth) and followed with a weak
reference to its untyped storage, whose callback subtracts it when it dies (views and
in-place results share a storage and add nothing; following keeps nothing alive). The
high-water mark moves at each birth, so a line's peak is exact, like CUDA's allocated and
peak bytes. Reading is two attribute loads; the cost is in the mode, a Python call per op.

Not counted (see docs/run.md, 'What memory is measured'):

- storages made before the sampler starts (torch's own at import): the count starts at 0
  when the run starts, before the script's first line;
- storages made in other threads (dispatch modes are thread-local) or in other processes
  (DataLoader workers); their deaths are not counted either;
- storages no aten op made: ``torch.from_numpy``, ``torch.frombuffer``, ``torch.load``'s
  and unpickled storages, ``UntypedStorage(n)``, and their resizes.

Resizes of a followed storage are followed, as the census sees them: an op that grows or
shrinks its output's storage (``resize_``, ``set_``, ``out=``) is seen when the op
returns, and ``untyped_storage().resize_(n)`` (FSDP2 frees and re-gathers its unsharded
parameters so; no dispatch mode sees it) through ``UntypedStorage.resize_``, wrapped while
the sampler runs (``follow_resizes``) and restored when it closes.

Importing this module imports torch (the runner imports it only for ``--memory tensors``);
nothing here starts CUDA.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..dispatch.lifetimes import plain_tensors, tensor_storage
from ..runfolder.records import TENSORS_SOURCE
from .samplers import Extras, RssSampler

__all__ = ["StorageBytes", "TensorSampler", "follow_resizes"]


class StorageBytes(TorchDispatchMode):
    """Bytes of the live storages on ``device_type`` born while the mode is active
    (``live``), their high-water mark (``peak``) and births plus deaths (``events``)."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.live = 0
        self.peak = 0
        self.events = 0
        self._refs: dict[int, list[Any]] = {}  # id(storage): [ref, nbytes now]

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
            if storage.nbytes() != entry[1]:  # an op resized it (resize_, set_, out=)
                self.resized(storage)
            return
        entry = [None, storage.nbytes()]
        entry[0] = weakref.ref(storage, self._on_death(key, entry))
        self._refs[key] = entry
        self.events += 1
        self.live += entry[1]
        if self.live > self.peak:
            self.peak = self.live

    def resized(self, storage: Any) -> None:
        """A storage may have changed size in place: if followed, count the difference
        (a rise moves the high-water mark)."""
        entry = self._refs.get(id(storage))
        if entry is None or entry[0]() is not storage:
            return
        nbytes = storage.nbytes()
        if nbytes == entry[1]:
            return
        self.events += 1
        self.live += nbytes - entry[1]
        entry[1] = nbytes
        if self.live > self.peak:
            self.peak = self.live

    def _on_death(self, key: int, entry: list[Any]) -> Callable[[Any], None]:
        def died(ref: Any) -> None:
            if self._refs.get(key) is entry:
                del self._refs[key]
            self.events += 1
            self.live -= entry[1]

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
        self._resizes = follow_resizes(self._mode.resized)
        self._resizes.__enter__()
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
        self._resizes.__exit__(None, None, None)
        self._mode.forget()
        self._rss.close()


@contextlib.contextmanager
def follow_resizes(resized: Callable[[Any], None]) -> Iterator[None]:
    """Call ``resized(storage)`` after each ``UntypedStorage.resize_`` (typed storages
    resize through it too) inside the block; on exit the method is restored, unless
    someone wrapped it again meanwhile (then ours stays in their chain, harmless)."""
    cls = torch.UntypedStorage
    had_own = "resize_" in cls.__dict__
    before = cls.__dict__.get("resize_")
    original = cls.resize_

    def resize_(storage: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(storage, *args, **kwargs)
        resized(storage)
        return result

    cls.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        if cls.__dict__.get("resize_") is resize_:  # else wrapped again since: leave the chain
            if had_own:
                cls.resize_ = before  # type: ignore[method-assign]
            else:
                del cls.resize_
