"""What a lever did in one run (``LeverReport``), and reading it back from a run folder.

A run's ``meta.json`` holds the reports as its top-level ``"levers"`` list, in the order
the levers were given (``runfolder.records.RunInfo.levers``); ``read_levers`` turns that
list back into records. Plain data; no torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["LeverReport", "read_levers"]


@dataclass(frozen=True)
class LeverReport:
    """One lever in one run.

    ``name``: the lever (``catalog.LEVERS``); ``applied``: whether it changed anything in
    this run; ``reason``: why not ("" when applied); ``detail``: what it did (e.g.
    ``"4 x Block in h"``, ``"bfloat16"``, ``"2 optimizers: AdamW"``); ``change``: the one
    line to write in the script (or the environment variable to set) for the same effect,
    as the user would write it; ``where``: ``file:line`` where that change goes ("" when
    not known, or for an environment variable); ``cost``: the price in words;
    ``changes_results``: whether the script's numbers change (lower precision);
    ``reached``: False when it did not apply because the run never got to what it changes
    (no model called, no optimizer built, no ``zero_grad``): it may apply to a run that
    gets further."""

    name: str
    applied: bool
    reason: str = ""
    detail: str = ""
    change: str = ""
    where: str = ""
    cost: str = ""
    changes_results: bool = False
    reached: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LeverReport:
        """The report of ``to_dict``'s mapping (fields missing from it take their defaults)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def read_levers(run_folder: str | Path) -> list[LeverReport]:
    """The lever reports of the run in ``run_folder`` (its ``meta.json``), in the order
    the levers were given; ``[]`` for a run without levers (and for runs written before
    levers existed). ``UsageError`` when there is no readable ``meta.json``."""
    meta = Path(run_folder) / "meta.json"
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {meta}: {getattr(exc, 'strerror', None) or exc}") from None
    items = data.get("levers") or [] if isinstance(data, dict) else []
    return [LeverReport.from_dict(item) for item in items if isinstance(item, dict)]
