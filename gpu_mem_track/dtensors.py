"""A distributed tensor's bytes on this rank: ``local_shard``.

A ``torch.distributed.tensor.DTensor`` (FSDP2's parameters, their gradients and optimizer
state) is a wrapper of the global shape with no storage of its own; what lives on this rank
is its local shard (``_local_tensor``). The census counts that, and the simulated GPU judges
a DTensor by it. Imports nothing: a DTensor exists only once ``torch.distributed.tensor`` is
imported, and the answer for a class is cached from then on.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["local_shard"]

_DISTRIBUTED: dict[type, bool] = {}


def local_shard(tensor: Any) -> Any:
    """A DTensor's local shard, else ``tensor`` itself."""
    cls = type(tensor)
    known = _DISTRIBUTED.get(cls)
    if known is None:
        dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
        if dtensor is None:
            return tensor
        known = _DISTRIBUTED[cls] = issubclass(cls, dtensor)
    return tensor._local_tensor if known else tensor
