"""Load a finished (or running) report for ``compare`` and ``plot``: a runner folder, one
of its CSVs, or a MemTracker CSV, as one frozen ``Run``.

Accepted inputs, told apart by what they hold (``detect``):

- a runner folder ``reports/<run>/`` (``meta.json``, ``lines.csv``, ``timeline.csv``; see
  ``runfolder.files``); ``lines.csv`` is missing until the run ends;
- a runner ``lines.csv`` or ``timeline.csv`` given directly (its folder's ``meta.json``,
  when there, names the run and its memory source);
- a MemTracker CSV (``reports/<run>.csv``, ``csvlog``'s format), told by its header.

Memory is in bytes of the run's *memory source*: the runner's (``"cuda allocator"``
or ``"process RSS"``), or for a MemTracker CSV the allocator's allocated bytes on CUDA
(``"cuda allocator"``) and the census's tensor bytes elsewhere (``"tensors"``).
Anything else raises ``UsageError`` with a one-line message.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..csvrows import open_csv
from ..errors import UsageError
from ..ranks import is_launch_folder
from ..runfolder.files import LINE_REQUIRED, TIMELINE_REQUIRED, RunFolder, read_lines, read_timeline
from ..runfolder.read import (
    DEFAULT_POINTS,
    LabelPoint,
    Sample,
    downsample,
    guess_source,
    read_info,
    read_series,
    reading,
)
from ..runfolder.rebuild import LineTotals, rebuilt_note
from ..runfolder.records import LineRecord, RunInfo
from ..runfolder.transients import raised_peaks
from ..tracker.csvlog import REQUIRED_COLUMNS, iter_stamps
from ..tracker.records import Stamp
from ..units import counted

__all__ = ["Run", "Source", "TRACKER_COLUMNS", "detect", "load_run"]

#: The columns of a MemTracker CSV (``csvlog.REQUIRED_COLUMNS``): how one is recognised.
TRACKER_COLUMNS = REQUIRED_COLUMNS


@dataclass(frozen=True)
class Source:
    """What a path holds, before loading it: ``kind`` is ``"folder"`` (a runner folder),
    ``"lines"``/``"timeline"`` (one of its CSVs) or ``"tracker"`` (a MemTracker CSV)."""

    path: Path
    kind: str

    @property
    def has_lines(self) -> bool:
        """Whether per-line records can be loaded from it: a ``lines.csv``, else rebuilt
        from a ``timeline.csv`` (see ``LineTotals``)."""
        if self.kind == "folder":
            folder = RunFolder(self.path)
            return folder.lines.is_file() or folder.timeline.is_file()
        return self.kind in ("lines", "timeline")

    @property
    def has_labels(self) -> bool:
        """Whether ``track()`` stamps can be loaded from it."""
        if self.kind == "folder":
            return RunFolder(self.path).timeline.is_file()
        return self.kind in ("timeline", "tracker")


@dataclass(frozen=True)
class Run:
    """One run, as ``compare`` and ``plot`` need it.

    ``name``: the run's name (``meta.json``'s, else the file or folder name); ``kind``:
    ``"runner"`` or ``"tracker"``; ``device``: ``"cuda:0"``, ``"cpu"``, ``""`` if unknown;
    ``memory_source``: what ``memory`` figures measure (see the module docstring);
    ``peak``: the highest memory seen (bytes; None if unknown); ``lines``: per-line
    records (None: not loaded or not recorded); ``labels``: the ``track()`` stamps in
    order (None: not loaded); ``samples``: the time series, downsampled (None: not
    loaded or none recorded); ``events``: timeline rows or stamps read; ``notes``: one
    line each on what the loader had to do about missing or cut files (a ``lines.csv``
    rebuilt from the timeline, a cut last row left out), for the caller to show;
    ``info``: a runner folder's ``meta.json`` (None: none, or a MemTracker CSV).
    """

    name: str
    path: Path
    kind: str
    device: str
    memory_source: str
    peak: int | None
    lines: tuple[LineRecord, ...] | None = None
    labels: tuple[LabelPoint, ...] | None = None
    samples: tuple[Sample, ...] | None = None
    events: int = 0
    notes: tuple[str, ...] = ()
    info: RunInfo | None = None

    def _repr_html_(self) -> str:
        """HTML for Jupyter's rich display (``html.tables.run_html``); ``repr`` stays text."""
        from ..html.tables import run_html

        return run_html(self)


def detect(path: str | Path) -> Source:
    """What ``path`` holds; ``UsageError`` (one line) when it is missing, unreadable or
    none of the accepted inputs."""
    path = Path(path)
    if path.is_dir():
        folder = RunFolder(path)
        if any(p.exists() for p in (folder.meta, folder.lines, folder.timeline)):
            return Source(path, "folder")
        if is_launch_folder(path):
            raise UsageError(
                f"{path} is a launch folder of a distributed run: name one of its rank<k>/ "
                "folders, or compare its ranks with --by rank"
            )
        runs = sorted(p.name for p in path.iterdir() if (p / "meta.json").is_file())
        if runs:
            example = path / runs[0]
            raise UsageError(f"{path} is a folder of {counted(len(runs), 'run')}: give one, e.g. {example}")
        raise UsageError(
            f"{path} is not a gpu_mem_track run folder (no meta.json, lines.csv or timeline.csv)"
        )
    if not path.exists():
        raise UsageError(f"no such run or report: {path}")
    cells = _header(path)
    if cells is not None and not cells:
        raise UsageError(f"{path} is empty (no CSV header): not a gpu_mem_track report")
    header = set(cells or ())
    if header.issuperset(TRACKER_COLUMNS):
        return Source(path, "tracker")
    if header.issuperset(TIMELINE_REQUIRED):
        return Source(path, "timeline")
    if header.issuperset(LINE_REQUIRED):
        return Source(path, "lines")
    raise UsageError(
        f"{path} is not a gpu_mem_track report (a run folder, its lines.csv or timeline.csv, "
        "or a MemTracker CSV)"
    )


def load_run(
    path: str | Path | Source, *, lines: bool = True, timeline: bool = True, points: int = DEFAULT_POINTS
) -> Run:
    """Load a run. ``lines``/``timeline``: whether to read a runner's ``lines.csv`` and
    ``timeline.csv`` (the timeline gives ``labels`` and ``samples``; it is streamed and
    its series cut to at most ``2 * points`` samples by ``downsample``). A MemTracker
    CSV is always read whole. ``UsageError`` (one line) for anything unreadable."""
    source = path if isinstance(path, Source) else detect(path)
    with reading(source.path):
        if source.kind == "tracker":
            return _load_tracker(source.path, points)
        return _load_runner(source, lines, timeline, points)


def _header(path: Path) -> list[str] | None:
    """The first row's cells: ``[]`` for an empty file, None for one that is not CSV
    text (binary, a pickle: not "empty")."""
    try:
        with open_csv(path) as handle:
            return next(csv.reader(handle), [])
    except UnicodeDecodeError:
        return None
    except csv.Error:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _load_runner(source: Source, lines: bool, timeline: bool, points: int) -> Run:
    folder = RunFolder(source.path if source.kind == "folder" else source.path.parent)
    info = read_info(folder.meta)
    notes: list[str] = []
    lines_path = folder.lines if source.kind == "folder" else source.path
    timeline_path = folder.timeline if source.kind == "folder" else source.path
    # An empty lines.csv: the run was stopped while it was being written.
    # (Not a regular file: the guarded reader says so.)
    lines_file = source.kind in ("folder", "lines") and _has_rows(lines_path)
    timeline_file = source.kind in ("folder", "timeline") and timeline_path.exists()
    records = labels = samples = None
    if lines and lines_file:
        records = tuple(read_lines(lines_path, notes))
    totals = LineTotals() if lines and not lines_file and timeline_file else None
    events = 0
    if (timeline or totals is not None) and timeline_file:
        raised = raised_peaks(read_timeline(timeline_path))
        rows = read_timeline(timeline_path, notes)
        labels, samples, events = read_series(rows, points, totals, raised)
    if totals is not None:
        records = tuple(totals.records())
        folder_given = source.kind == "folder"
        notes.insert(0, rebuilt_note(source.path, folder_given, folder_given and lines_path.is_file()))
    peak = info.peak if info is not None else None
    if peak is None:
        peak = _highest([s.memory for s in samples or ()] + [r.peak for r in records or ()])
    name, device, memory_source = _identity(source, info, samples)
    parts = (records, labels, samples, events, tuple(notes), info)
    return Run(name, source.path, "runner", device, memory_source, peak, *parts)


def _has_rows(path: Path) -> bool:
    return path.exists() and (not path.is_file() or path.stat().st_size > 0)


def _identity(
    source: Source, info: RunInfo | None, samples: tuple[Sample, ...] | None
) -> tuple[str, str, str]:
    """The run's name, device and memory source: meta.json's, else from the path and samples."""
    if info is not None:
        return info.run_name, info.device, info.memory_source
    name = source.path.name if source.kind == "folder" else source.path.stem
    return name, "", guess_source(samples)


def _load_tracker(path: Path, points: int) -> Run:
    labels: list[LabelPoint] = []
    devices: set[str] = set()
    counted = [0]
    notes: list[str] = []

    def samples() -> Iterator[Sample]:
        for stamp in iter_stamps(path, notes):
            counted[0] += 1
            sample, label = _tracker_point(stamp)
            devices.add(stamp.ledger.device)
            labels.append(label)
            yield sample

    kept = tuple(downsample(samples(), points))
    device = min(devices) if devices else ""  # one tracker, one device
    source = "cuda allocator" if device.startswith("cuda") else "tensors"
    peak = _highest([s.memory for s in kept])
    return Run(
        path.stem, path, "tracker", device, source, peak, None, tuple(labels), kept, counted[0], tuple(notes)
    )


def _tracker_point(stamp: Stamp) -> tuple[Sample, LabelPoint]:
    """A tracker stamp as a timeline sample and a label: allocated bytes on CUDA, else the
    tensor total."""
    ledger = stamp.ledger
    on_cuda = ledger.device.startswith("cuda")
    memory = ledger.allocated if on_cuda and ledger.allocated is not None else ledger.tensors
    sample = Sample(stamp.elapsed, memory, ledger.allocated, ledger.reserved, ledger.driver, ledger.rss)
    label = LabelPoint(stamp.label, stamp.elapsed, memory, stamp.file, stamp.function, stamp.line)
    return sample, label


def _highest(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
