"""What would fit: the simulated GPU prices the ways out of out-of-memory.

``fit(script, args, gpu=...)`` (``api``) runs the unmodified script in simulated trials
(``trials``): as it is, then with each lever of ``run --lever`` alone and the cheapest
combination that fits (``plan``), and with a batch argument the largest batch that fits
(``batch``). The answer is pure data (``records``), rendered as text (``render``) or an
HTML page (``page``). Importing this package imports no torch.
"""

from __future__ import annotations

from .api import fit
from .records import FitResult, FitRow

__all__ = ["FitResult", "FitRow", "fit"]
