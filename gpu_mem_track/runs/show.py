"""``show``: any report gpu_mem_track writes, as its text report.

- a MemTracker CSV (``reports/<run>.csv``; also a run folder's ``tracker.csv`` and
  ``census.csv``): the stamps as the tracker's log prints them;
- a runner folder, its ``lines.csv`` or its ``timeline.csv``: the run's report, as
  ``report.txt`` holds it, rendered from the records (from the timeline when the run
  left no ``lines.csv``: see ``rebuild``).

``show_report`` returns the text and the notes (what was missing or cut); it never prints.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UsageError
from ..runfolder.files import RunFolder
from ..runfolder.read import reading
from ..runfolder.records import LineRecord, RunInfo
from ..tracker.csvlog import read_stamps
from .load import Run, Source, detect, load_run

__all__ = ["Shown", "show_report"]

#: The runner's automatic censuses in a run folder (``MemTracker`` run name ``census``).
CENSUS_CSV = "census.csv"


@dataclass(frozen=True)
class Shown:
    """What ``show`` prints: ``text`` on stdout, each of ``notes`` as one line on stderr."""

    text: str
    notes: tuple[str, ...] = ()


def show_report(path: str | Path, detail: bool = True) -> Shown:
    """The text report of ``path`` (see the module docstring). ``detail``: a MemTracker
    CSV's changed tensor groups too (a run's report is always whole). ``UsageError``
    (one line) when ``path`` is missing, unreadable or none of those."""
    source = detect(path)
    if source.kind == "tracker":
        notes: list[str] = []
        with reading(source.path):
            stamps = read_stamps(source.path, notes)
        from ..tracker.render import render_stamps

        return Shown(render_stamps(stamps, detail), tuple(notes))
    return _show_run(source)


def _show_run(source: Source) -> Shown:
    from ..runfolder.render import render_line_report

    run = load_run(source, lines=True, timeline=False)
    folder = RunFolder(source.path if source.kind == "folder" else source.path.parent)
    if run.lines is None:
        raise UsageError(
            f"{source.path} has neither lines.csv nor timeline.csv: "
            "the run stopped before it recorded anything"
        )
    if run.info is None:
        raise UsageError(
            f"{folder.meta} is missing, and show prints the run's description from it; "
            f"compare and plot read {source.path.name} alone"
        )
    notes = list(run.notes)
    censuses = _censuses(folder.path / CENSUS_CSV, notes)
    text = render_line_report(_with_peak(run.info, run), run.lines, censuses)
    return Shown(text, tuple(notes))


def _censuses(path: Path, notes: list[str]) -> list[str]:
    """The runner's automatic censuses saved in ``path``, each rendered as the report shows it."""
    from ..tracker.render import render_stamp

    if not path.is_file():
        return []
    with reading(path):
        return [render_stamp(stamp) for stamp in read_stamps(path, notes)]


def _with_peak(info: RunInfo, run: Run) -> RunInfo:
    """A killed run's ``meta.json`` has no peak: take the run's highest figure and the
    line that reached it."""
    if info.peak is not None or run.peak is None:
        return info
    # Of the lines that reached it, one that allocated (not a bystander such as a loop head).
    top: LineRecord | None = max(run.lines or (), key=lambda r: (r.peak, r.growth), default=None)
    where = f"{top.file}:{top.line}" if top is not None and top.peak == run.peak else ""
    return replace(info, peak=run.peak, peak_at=where)
