"""Keeping the census's weak references out of ``torch.utils.swap_tensors``'s way.

``torch.utils.swap_tensors(t1, t2)`` refuses a tensor that has any weak reference
(``weakref.getweakrefs(t1)`` must be empty: torch/utils/__init__.py, "Cannot swap t1
because it has weakref associated with it"). The census holds weak references to the
tensors it found (``LiveTensorFinder``'s known tensors, ``CensusMemo``'s entries), and
``nn.Module._apply`` swaps every parameter when
``torch.__future__.set_swap_module_params_on_conversion(True)`` is set or the parameter
is a tensor subclass such as FSDP2's DTensor (``fully_shard(model)`` then
``model.to("cuda")``): without this guard that ``.to()`` fails after a ``track()``.

``install()`` replaces ``torch.utils.swap_tensors`` (looked up there by
``nn.Module._apply``, ``load_state_dict`` with ``assign``, FSDP2's ``_fsdp_init`` and
``parametrize``) by a wrapper: before the swap, each holder registered with ``hold``
drops its weak references to the two tensors (``release``: the finder drops all of its
known tensors' and walks the heap at its next call, the memo the two tensors' entries),
so only the program's own ones are left for torch's check; the holders' next census
finds the two tensors again. Without holders the wrapper only calls torch's function.
Installed once, by the first finder or memo, and left in place (it changes nothing else).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Protocol

import torch
import torch.utils

__all__ = ["Holder", "hold", "install", "installed"]


class Holder(Protocol):
    """What holds weak references to tensors that a swap must not meet."""

    def release(self, tensors: tuple[Any, ...]) -> None:
        """Drop every weak reference of the holder to ``tensors`` (by identity)."""


_HOLDERS: weakref.WeakSet[Any] = weakref.WeakSet()


def hold(holder: Holder) -> None:
    """Register ``holder`` (held weakly) and make sure the wrapper is installed."""
    _HOLDERS.add(holder)
    install()


def installed() -> bool:
    """Whether ``torch.utils.swap_tensors`` is the wrapper."""
    return getattr(torch.utils.swap_tensors, "__gpu_mem_track_guard__", False)


def install() -> None:
    """Replace ``torch.utils.swap_tensors`` by the wrapper (once)."""
    if installed():
        return
    original = torch.utils.swap_tensors

    @functools.wraps(original)
    def swap_tensors(t1: Any, t2: Any) -> None:
        for holder in list(_HOLDERS):
            holder.release((t1, t2))
        return original(t1, t2)  # type: ignore[no-any-return]

    swap_tensors.__gpu_mem_track_guard__ = True  # type: ignore[attr-defined]
    torch.utils.swap_tensors = swap_tensors
