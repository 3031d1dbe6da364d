"""The launch folder of a distributed run: every rank's figures side by side.

A launch folder ``reports/<launch>/`` (see ``gpu_mem_track.ranks``) holds one run folder
per rank, ``rank<k>/``, and, built from their ``meta.json`` files:

- ``ranks.csv``: one row per rank, columns ``RANK_COLUMNS`` (see :class:`RankSummary`);
- ``report.txt``: the ranks table and the spread of their peaks.

Every rank writes its own folder first, then rebuilds these two files under a lock
(``.ranks.lock``, where the OS has ``fcntl``), so whichever rank ends last leaves them
whole and nothing waits on another rank. Rank 0 also waits a bounded time for the others
to end (:func:`wait_for_ranks`) before printing the table.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from ..ranks import RankInfo, rank_folders
from .files import csv_line, read_meta, replace_text
from .records import RunInfo

__all__ = [
    "RANK_COLUMNS",
    "LaunchSummary",
    "RankSummary",
    "read_launch",
    "report_launch",
    "wait_for_ranks",
    "write_launch_files",
]


@dataclass(frozen=True)
class RankSummary:
    """One rank of a launch, from its ``meta.json``.

    ``status``: ``"ok"`` (exit code 0), ``"exit N"`` (the script failed or was stopped:
    130 after Ctrl-C, 143 after SIGTERM), ``"no end"`` (no clean end was recorded: the
    rank was killed, or is still running) or ``"missing"`` (no folder or no
    ``meta.json``: the rank never started under the runner). ``peak``, ``end_memory``:
    bytes of the rank's memory source (None where unknown); ``peak_at``: ``file:line``;
    ``peak_phase``: the last ``MemTracker.track()`` label before the peak; ``folder``: the
    rank's run folder.
    """

    rank: int
    status: str
    device: str = ""
    peak: int | None = None
    peak_at: str = ""
    peak_phase: str = ""
    end_memory: int | None = None
    exit_code: int | None = None
    folder: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankSummary:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


#: Columns of ``ranks.csv``: the fields of :class:`RankSummary`, in order.
RANK_COLUMNS = tuple(f.name for f in fields(RankSummary))


@dataclass(frozen=True)
class LaunchSummary:
    """The ranks of one launch folder (``launch``: its name; ``script``: the script the
    ranks ran; ``world_size``: as the ranks recorded it), one entry per rank 0 ..
    ``world_size`` - 1 (missing ones included), in rank order."""

    launch: str
    script: str
    world_size: int
    ranks: tuple[RankSummary, ...]

    @property
    def complete(self) -> bool:
        """Whether every rank recorded an end (cleanly or not)."""
        return all(r.status not in ("no end", "missing") for r in self.ranks)

    @property
    def spread(self) -> float | None:
        """Largest peak over smallest, among ranks with a peak above 0 (None with fewer
        than one such rank)."""
        peaks = [r.peak for r in self.ranks if r.peak]
        return max(peaks) / min(peaks) if peaks else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["spread"] = self.spread
        return data


def rank_summary(rank: int, folder: Path | None, info: RunInfo | None) -> RankSummary:
    """The summary of one rank from its run folder and its ``meta.json`` (``"missing"``
    when either is None)."""
    if info is None:
        return RankSummary(rank, "missing", folder="" if folder is None else str(folder))
    return RankSummary(
        rank=rank,
        status=_status(info),
        device=info.device,
        peak=info.peak,
        peak_at=info.peak_at,
        peak_phase=info.peak_phase,
        end_memory=info.end_memory,
        exit_code=info.exit_code,
        folder=str(folder),
    )


def _status(info: RunInfo) -> str:
    if info.ended is None or info.exit_code is None:
        return "no end"
    return "ok" if info.exit_code == 0 else f"exit {info.exit_code}"


def _meta(folder: Path) -> RunInfo | None:
    try:
        return read_meta(folder / "meta.json")
    except (OSError, ValueError, TypeError):  # not written yet, or cut short
        return None


def read_launch(launch: str | Path) -> LaunchSummary:
    """The summary of a launch folder from its ranks' ``meta.json`` files; raises
    ``ValueError`` when ``launch`` holds no ``rank<k>`` folder."""
    path = Path(launch)
    folders = rank_folders(path)
    if not folders:
        raise ValueError(f"{path} is not a launch folder (it holds no rank<k> folder)")
    infos = {rank: _meta(folder) for rank, folder in folders.items()}
    known = [info for info in infos.values() if info is not None]
    world = max([max(folders) + 1, *(info.world_size or 0 for info in known)])
    script = known[0].script if known else ""
    ranks = tuple(rank_summary(k, folders.get(k), infos.get(k)) for k in range(world))
    return LaunchSummary(path.name, script, world, ranks)


def wait_for_ranks(
    launch: Path,
    world_size: int,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> LaunchSummary:
    """Poll the launch folder until every one of ``world_size`` ranks recorded an end
    or ``timeout`` seconds passed; the last summary read."""
    deadline = clock() + timeout
    while True:
        summary = read_launch(launch)
        if (summary.complete and summary.world_size >= world_size) or clock() >= deadline:
            return summary
        sleep(min(0.1, max(0.0, deadline - clock())))


def write_launch_files(launch: Path) -> LaunchSummary:
    """Rebuild ``ranks.csv`` and ``report.txt`` of a launch folder from its ranks'
    ``meta.json`` files, under the folder's lock, each replaced atomically."""
    from .render import render_launch_report

    with _locked(launch / ".ranks.lock"):
        summary = read_launch(launch)
        replace_text(launch / "ranks.csv", _ranks_csv(summary))
        replace_text(launch / "report.txt", render_launch_report(summary))
    return summary


def _ranks_csv(summary: LaunchSummary) -> str:
    rows = ([getattr(row, c) for c in RANK_COLUMNS] for row in summary.ranks)
    return csv_line(RANK_COLUMNS) + "".join(csv_line(values) for values in rows)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (nothing where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def report_launch(launch: Path, rank: RankInfo, wait: float, out: TextIO) -> None:
    """Rebuild the launch folder's ranks table; on rank 0, wait up to ``wait`` seconds
    for the other ranks to end, rebuild it again and print it on ``out``."""
    from .render import render_ranks

    try:
        summary = write_launch_files(launch)
        if not rank.is_first:
            return
        if not summary.complete or summary.world_size < rank.world_size:
            wait_for_ranks(launch, rank.world_size, wait)
            summary = write_launch_files(launch)
    except (OSError, ValueError) as exc:  # a rank's own reports are whole: only the table is lost
        print(f"gpu_mem_track: cannot write the ranks table of {launch}: {exc}", file=sys.stderr)
        return
    out.write(f"Ranks of {launch}{os.sep} (ranks.csv, report.txt):\n{render_ranks(summary)}")
    out.flush()
