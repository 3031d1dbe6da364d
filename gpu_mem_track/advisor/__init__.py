"""What would fit: the simulated GPU prices the ways out of out-of-memory.

``fit(script, args, gpu=...)`` (``api``) runs the unmodified script in simulated trials
(``trials``): as it is, then with each lever of ``run --lever`` alone and the cheapest
combination that fits (``plan``), and with a batch argument the largest batch that fits
(``batch``). The answer is pure data (``records``), rendered as text (``render``) or an
HTML page (``page``). ``fit_distributed(script, args, gpu=..., nproc=...)``
(``distributed``) is ``fit --nproc-per-node``: the script's ranks, the sharding levers,
the world size; its answer (``DistributedFit``) is rendered by ``worldrender`` and
``worldpage``. Importing this package imports no torch.
"""

from __future__ import annotations

from .api import fit
from .distributed import DistributedFit, fit_distributed
from .records import FitResult, FitRow

__all__ = ["DistributedFit", "FitResult", "FitRow", "fit", "fit_distributed"]
