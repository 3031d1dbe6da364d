"""What a finished run returns: ``run.execute``'s result (the run folder's records plus the
automatic censuses, which are tracker stamps and so not part of the folder's format)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..runfolder.records import LineRecord, RunInfo, SnapshotMerge

if TYPE_CHECKING:
    from ..tracker.records import Stamp

__all__ = ["RunResult"]


@dataclass(frozen=True)
class RunResult:
    """What ``run.execute`` returns: the script's ``exit_code``, the run ``folder``, the
    run's description (``info``), its line ``records``, its automatic ``censuses``
    (``tracker.records.Stamp``, in order; empty without ``--census-threshold``) and, with
    ``--snapshot``, how the memory snapshot was merged (``snapshot``)."""

    exit_code: int
    folder: Path
    info: RunInfo
    records: tuple[LineRecord, ...] = ()
    censuses: tuple[Stamp, ...] = ()
    snapshot: SnapshotMerge | None = None
