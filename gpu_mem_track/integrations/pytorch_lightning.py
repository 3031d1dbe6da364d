"""Memory stamps for ``pytorch_lightning.Trainer``: ``LightningMemTrackCallback``, the
same callback as ``integrations.lightning``'s on the ``pytorch_lightning`` package's
``Callback`` class. Needs pytorch_lightning 2.0 or later (installed with the
``lightning`` extra: ``pip install "gpu_mem_track[lightning]"``).
"""

from __future__ import annotations

from .lightning_hooks import LightningHooks
from .session import missing_extra

try:
    from pytorch_lightning import Callback
except ModuleNotFoundError as exc:
    error = missing_extra(exc, ("pytorch_lightning",), "lightning", __name__)
    if error is None:
        raise
    raise error from exc

__all__ = ["LightningMemTrackCallback"]


class LightningMemTrackCallback(LightningHooks, Callback):
    __doc__ = LightningHooks.__doc__
