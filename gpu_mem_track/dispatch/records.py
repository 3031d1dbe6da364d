"""Records of the dispatch modes: frozen data, nothing measured here (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ValueRead"]


@dataclass(frozen=True)
class ValueRead:
    """Model code read a value from a meta tensor (which has no data), ``count`` times in
    the measured step.

    ``op`` is what read it (``item`` for ``item()``, ``bool()``, ``tolist()``; a
    data-dependent op such as ``nonzero``), ``module`` the innermost module running.
    ``placeholder`` is ``""`` when the value was computed for real on the CPU (the tensor
    was small and made only from known values), else the placeholder returned instead
    (``"0"``, ``"False"``, ``"zeros"``): the model then ran on a value that is not its own.
    """

    op: str
    module: str
    placeholder: str
    count: int
