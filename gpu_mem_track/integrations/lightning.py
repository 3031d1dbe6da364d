"""Memory stamps for ``lightning.Trainer``: ``LightningMemTrackCallback``.

``lightning.Trainer(..., callbacks=[LightningMemTrackCallback()])``; the hooks and stamps
are described in ``integrations.lightning_hooks``, the folder, ranks and options in
``integrations.session``. For the older ``pytorch_lightning`` package (its own
``Callback`` class) use ``gpu_mem_track.integrations.pytorch_lightning``.
Needs Lightning 2.0 or later: ``pip install "gpu_mem_track[lightning]"``.
"""

from __future__ import annotations

from .lightning_hooks import LightningHooks
from .session import missing_extra

try:
    from lightning.pytorch import Callback
except ModuleNotFoundError as exc:
    error = missing_extra(exc, ("lightning",), "lightning", __name__)
    if error is None:
        raise
    raise error from exc

__all__ = ["LightningMemTrackCallback"]


class LightningMemTrackCallback(LightningHooks, Callback):
    __doc__ = LightningHooks.__doc__
