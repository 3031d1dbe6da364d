"""Large CPU tensors made while a module is being built are simulated too ("virtual CPU").

A training script usually builds its model on the CPU and then moves it
(``model = GPT(config).to("cuda")``). Built for real, a 7B-parameter model needs 28 GB of
RAM and minutes of random initialisation before the simulation has anything to do.
While a simulated GPU runs, a CPU factory call (``torch.empty``, ``zeros``, ``randn``,
...) made inside a module's construction (a frame of ``__init__``, ``reset_parameters``,
``_init_weights``, ``init_weights`` or ``apply`` of an ``nn.Module``, within
:data:`DEPTH` frames) that makes a floating-point tensor, or any tensor of at least
:data:`THRESHOLD` bytes, makes a meta tensor that says it is on the CPU and counts on no
device. In-place initialisation (``normal_``, ``uniform_``, ``zero_``) costs nothing on
it, and tensors computed only from such tensors are virtual too. Moving one to CUDA
(``.to("cuda")``, ``.cuda()``, ``model.to(device)``) allocates a simulated GPU tensor
of its shape. Being meta on both sides, a parameter keeps its identity when its module
moves, as on a GPU (a CPU parameter moved to a meta tensor would become a new
``Parameter``, cutting weight ties and leaving an optimizer made before the move with
stale parameters). Their values are not known: reading them gives placeholders
(recorded), as for any parameter on the simulated GPU. Limit: a module built and then used
*on the CPU* computes on meta tensors, not on real data (rare in training scripts,
where models move before use). Integer and boolean tensors under the threshold and
everything made outside a module's construction stay real.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from torch import nn

__all__ = ["DEPTH", "FACTORIES", "THRESHOLD", "VirtualCpu", "default_device"]

#: Bytes from which a CPU factory call in a module's construction is virtual.
THRESHOLD = 1 << 20
#: How many frames up a module's constructing frame is looked for.
DEPTH = 24
_BUILDERS = frozenset(
    {"__init__", "reset_parameters", "_reset_parameters", "_init_weights", "init_weights", "apply"}
)
#: The factories that may make a virtual tensor.
FACTORIES = frozenset(
    {
        torch.empty,
        torch.zeros,
        torch.ones,
        torch.full,
        torch.rand,
        torch.randn,
        torch.empty_strided,
        torch.normal,
    }
)
_DTYPE_BYTES = {torch.bool: 1, torch.uint8: 1, torch.int8: 1}


class VirtualCpu:
    """The storages of virtual CPU tensors (held weakly; see the module doc)."""

    def __init__(self) -> None:
        self.storages: weakref.WeakSet[Any] = weakref.WeakSet()
        self.making = False

    def __bool__(self) -> bool:
        return bool(self.storages)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` (a meta tensor) is virtual CPU."""
        return bool(self.storages) and tensor.untyped_storage() in self.storages

    def add(self, tensor: torch.Tensor) -> None:
        self.storages.add(tensor.untyped_storage())

    def wanted(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """Whether this factory call (device CPU or unset) should make a virtual tensor."""
        if func not in FACTORIES or kwargs.get("device") not in (None, "cpu", torch.device("cpu")):
            return False
        default = default_device()
        if default is not None and torch.device(default).type != "cpu":
            return False
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        if not dtype.is_floating_point and _nbytes(func, args, kwargs) < THRESHOLD:
            return False
        return _building_a_module()


def default_device() -> Any:
    """The device ``torch.set_default_device`` set (None: none), read without making a
    tensor (``torch.get_default_device`` makes one, which would recurse here)."""
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return None if context is None else context.device


def _nbytes(func: Any, args: tuple, kwargs: dict) -> int:
    if func is torch.normal:
        size = kwargs.get("size") or (args[2] if len(args) > 2 else None)
        if size is None:
            return 0
    else:
        size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
        if func in (torch.full, torch.empty_strided):
            size = args[0] if args else kwargs.get("size", ())
        if not args:
            size = kwargs.get("size", ())
    numel = 1
    for n in size:
        if not isinstance(n, int):
            return 0
        numel *= n
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    return numel * (_DTYPE_BYTES.get(dtype) or torch.empty((), dtype=dtype, device="meta").element_size())


def _building_a_module() -> bool:
    frame = sys._getframe(2)
    for _ in range(DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_name in _BUILDERS and isinstance(frame.f_locals.get("self"), nn.Module):
            return True
        frame = frame.f_back
    return False
