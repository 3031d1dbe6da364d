"""Memory stamps where no ``track()`` line is written: trainer callbacks.

- ``HFMemTrackCallback`` (``gpu_mem_track.integrations.hf``) for ``transformers.Trainer``
  (``pip install "gpu_mem_track[hf]"``);
- ``LightningMemTrackCallback`` (``gpu_mem_track.integrations.lightning``) for
  ``lightning.Trainer``, and the same for ``pytorch_lightning.Trainer`` in
  ``gpu_mem_track.integrations.pytorch_lightning`` (``pip install "gpu_mem_track[lightning]"``).

Both stamp at train start, after the first step's forward, backward and optimizer step,
every N steps and at train end, into one run folder per training run (one per rank under
``torchrun``); ``session.TrainingSession`` holds what they share. Importing this package
imports neither framework: each name loads its module on first use, and a missing
framework raises an ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hf import HFMemTrackCallback
    from .lightning import LightningMemTrackCallback

__all__ = ["HFMemTrackCallback", "LightningMemTrackCallback"]

_HOMES = {"HFMemTrackCallback": "hf", "LightningMemTrackCallback": "lightning"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
