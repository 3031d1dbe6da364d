"""The program's own meta tensors, told apart from simulated GPU tensors (both are meta).

A simulated GPU tensor is a meta tensor (:mod:`~gpu_mem_track.simgpu.face`). A program
may also make meta tensors itself: a model built under ``with torch.device("meta")``
(torchtitan's and PyTorch's FSDP2 example's way), then moved with
``model.to_empty(device="cuda")`` and initialised there. On a GPU those meta tensors hold
no memory, say ``device='meta'`` and cannot be copied out of (``.to("cuda")`` raises
``NotImplementedError: Cannot copy out of meta tensor; no data!``, which
``nn.Module.to`` turns into its hint to use ``to_empty``).

:class:`MetaTensors` holds their storages weakly. A call the face sees with a ``meta``
device argument (``device="meta"``, injected by ``torch.device("meta")`` or
``torch.set_default_device("meta")``; ``.to("meta")``) made by code outside this package
(the program's, torch's, a library's) runs with ``making`` set, and the dispatch side
(:class:`~gpu_mem_track.simgpu.engine.Storages`) records its outputs here and counts
them nowhere; so are the outputs of an op whose meta inputs are all the program's
(in-place initialisation, ``empty_like`` of one). A call whose CUDA device argument the
face rewrote runs with ``gpu`` set: its outputs are simulated GPU tensors whatever its
inputs (``torch.empty_like(meta_param, device="cuda")``, which ``to_empty`` makes).
This package's own ``meta`` calls (loading onto the simulated GPU, the value tracker's
copies) mean the simulated GPU and are not the program's.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..dtensors import local_shard

__all__ = ["MetaTensors", "is_meta_device"]

_OUR_DIR = str(Path(__file__).resolve().parents[1])


def is_meta_device(value: Any) -> bool:
    """Whether a device argument names the meta device (``"meta"`` or a meta ``torch.device``)."""
    if isinstance(value, str):
        return value == "meta" or value.startswith("meta:")
    return isinstance(value, torch.device) and value.type == "meta"


def called_from_us(depth: int) -> bool:
    """Whether the frame ``depth`` levels above the caller is this package's code."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return False
    return frame.f_code.co_filename.startswith(_OUR_DIR)


class MetaTensors:
    """The storages of the program's meta tensors (held weakly; see the module doc)."""

    def __init__(self) -> None:
        self.storages: weakref.WeakSet[Any] = weakref.WeakSet()
        #: A call making the program's meta tensors is running.
        self.making = False
        #: A call onto the simulated GPU is running: its outputs are GPU tensors.
        self.gpu = False

    def __bool__(self) -> bool:
        return bool(self.storages)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` (a meta tensor) is one of the program's. A DTensor is judged
        by its local tensor (its own storage is a wrapper's, of the global size)."""
        if not self.storages:
            return False
        tensor = local_shard(tensor)
        try:
            return tensor.untyped_storage() in self.storages
        except Exception:  # no storage (a wrapper subclass)
            return False

    def add(self, tensor: torch.Tensor) -> None:
        try:
            self.storages.add(local_shard(tensor).untyped_storage())
        except Exception:  # no storage (a wrapper subclass): its parts are added by their ops
            pass

    def run(self, making: bool, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``func`` with ``making`` (the program's meta tensors) or ``gpu`` set."""
        was = self.making, self.gpu
        self.making, self.gpu = making, not making
        try:
            return func(*args, **kwargs)
        finally:
            self.making, self.gpu = was
