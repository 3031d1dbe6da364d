"""The run in progress: how ``MemTracker`` objects created inside a script that
``python -m gpu_mem_track run`` runs find that run's folder and timeline.

The runner sets ``current`` for the duration of the script and clears it after. A
tracker created meanwhile with the default output folder writes its log and CSV into the
run folder, and each of its stamps becomes a ``track`` row of the run's timeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

__all__ = ["ActiveRun", "current"]


class ActiveRun(Protocol):
    #: the run folder (``reports/<run name>/``)
    folder: Path

    def stamped(self, tracker: Any, stamp: Any) -> None:
        """Called after ``tracker`` wrote ``stamp`` (a ``records.Stamp``)."""


current: ActiveRun | None = None
