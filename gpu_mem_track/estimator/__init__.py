"""GPU-free estimates of a training step and the batch-size finder.

``simulate`` runs the step on meta tensors (with ``step``, and the storage lifetimes,
device memories and known values of ``gpu_mem_track.dispatch``, which the simulated GPU
shares); ``watch`` gives storages their roles and builds the result;
``options`` holds a step's options; ``specs`` parses inputs and factories; ``records``
holds the results, ``render`` their text; ``batchsize`` searches the largest batch under
a budget. ``distributed`` (with ``fsdp``) adds what one rank of DDP, ZeRO or FSDP2 holds;
``rank_step`` measures a real rank under torchrun, to check it. The ``estimate`` and
``batch-size`` commands live in ``gpu_mem_track.commands``. ``estimate`` and
``find_max_batch_size`` load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batchsize import find_max_batch_size
    from .simulate import estimate

__all__ = ["estimate", "find_max_batch_size"]


def __getattr__(name: str) -> Any:
    if name == "estimate":
        from .simulate import estimate

        return estimate
    if name == "find_max_batch_size":
        from .batchsize import find_max_batch_size

        return find_max_batch_size
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
