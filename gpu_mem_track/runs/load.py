"""Load a finished (or running) report for ``compare`` and ``plot``: a runner folder, one
of its CSVs, or a MemTracker CSV, as one frozen ``Run``.

Accepted inputs, told apart by what they hold (``detect``):

- a runner folder ``reports/<run>/`` (``meta.json``, ``lines.csv``, ``timeline.csv``; see
  ``runner.files``); ``lines.csv`` is missing until the run ends;
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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..csvrows import CompleteRows, cut_note
from ..errors import UsageError
from ..ranks import is_launch_folder
from ..runner.files import LINE_REQUIRED, TIMELINE_REQUIRED, RunFolder, read_lines, read_meta, read_timeline
from ..runner.records import LineRecord, RunInfo, TimelineRow
from ..tracker.csvlog import REQUIRED_COLUMNS, stamps_from_rows
from ..tracker.records import Stamp
from ..units import counted
from .rebuild import LineTotals, rebuilt_note

__all__ = [
    "DEFAULT_POINTS",
    "LabelPoint",
    "Run",
    "Sample",
    "Source",
    "detect",
    "downsample",
    "load_run",
    "reading",
]

#: Default cap on the time series' buckets; each keeps its lowest and highest sample,
#: so a series has at most twice this many points.
DEFAULT_POINTS = 2000

#: The columns of a MemTracker CSV (``csvlog.REQUIRED_COLUMNS``): how one is recognised.
TRACKER_COLUMNS = REQUIRED_COLUMNS


@dataclass(frozen=True)
class Sample:
    """Memory at one moment: ``elapsed`` seconds since the run started; ``memory`` in
    bytes of the run's memory source; the other figures where known (bytes, else None)."""

    elapsed: float
    memory: int
    allocated: int | None = None
    reserved: int | None = None
    driver: int | None = None
    rss: int | None = None


@dataclass(frozen=True)
class LabelPoint:
    """One ``MemTracker.track()`` stamp: its label (``""`` when none was given), when
    (seconds since the start), the memory then (bytes of the memory source, None if
    unknown) and the calling ``file`` (as recorded), ``function`` and ``line``."""

    label: str
    elapsed: float
    memory: int | None
    file: str
    function: str
    line: int | None


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
        if any(p.is_file() for p in (folder.meta, folder.lines, folder.timeline)):
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
    header = set(_header(path))
    if not header:
        raise UsageError(f"{path} is empty (no CSV header): not a gpu_mem_track report")
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


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Turn what reading the report at ``path`` may raise (a bad row, bad text, an OS
    error) into a one-line ``UsageError`` naming the file."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not a text report ({exc.reason})") from exc
    except (ValueError, KeyError, csv.Error) as exc:
        text = str(exc)  # the readers' messages name the file and line already
        raise UsageError(
            f"not a valid report: {text}" if str(path) in text else f"{path} is not a valid report: {text}"
        ) from exc
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def downsample(samples: Iterable[Sample], points: int = DEFAULT_POINTS) -> list[Sample]:
    """At most ``2 * points`` samples from a stream, in order, holding on to only that
    many: consecutive samples are grouped into equal buckets (the bucket size doubles
    whenever more than ``points`` buckets would be needed) and each bucket keeps its
    lowest and highest ``memory``, so no peak or trough is lost. Fewer samples than
    ``points`` come back unchanged."""
    if points < 1:
        raise ValueError("points must be at least 1")
    buckets: list[list] = []  # [lowest, highest, count], each sample as (index, Sample)
    size = 1
    for index, sample in enumerate(samples):
        item = (index, sample)
        if buckets and buckets[-1][2] < size:
            bucket = buckets[-1]
            bucket[0] = min(bucket[0], item, key=_memory)
            bucket[1] = max(bucket[1], item, key=_memory)
            bucket[2] += 1
            continue
        buckets.append([item, item, 1])
        if len(buckets) > points:
            buckets = [_merge(buckets[i : i + 2]) for i in range(0, len(buckets), 2)]
            size *= 2
    kept: list[Sample] = []
    for low, high, _ in buckets:
        kept.extend(s for _, s in sorted({low, high}, key=lambda item: item[0]))
    return kept


def _memory(item: tuple[int, Sample]) -> int:
    return item[1].memory


def _merge(pair: list[list]) -> list:
    return [
        min((b[0] for b in pair), key=_memory),
        max((b[1] for b in pair), key=_memory),
        sum(b[2] for b in pair),
    ]


def _header(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            return next(csv.reader(handle), [])
    except UnicodeDecodeError:
        return []
    except csv.Error:
        return []
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _load_runner(source: Source, lines: bool, timeline: bool, points: int) -> Run:
    folder = RunFolder(source.path if source.kind == "folder" else source.path.parent)
    info = _meta(folder.meta)
    notes: list[str] = []
    lines_path = folder.lines if source.kind == "folder" else source.path
    timeline_path = folder.timeline if source.kind == "folder" else source.path
    # An empty lines.csv: the run was stopped while it was being written.
    lines_file = source.kind in ("folder", "lines") and lines_path.is_file() and lines_path.stat().st_size > 0
    timeline_file = source.kind in ("folder", "timeline") and timeline_path.is_file()
    records = labels = samples = None
    if lines and lines_file:
        records = tuple(read_lines(lines_path, notes))
    totals = LineTotals() if lines and not lines_file and timeline_file else None
    events = 0
    if (timeline or totals is not None) and timeline_file:
        labels, samples, events = _read_timeline(read_timeline(timeline_path, notes), points, totals)
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


def _identity(
    source: Source, info: RunInfo | None, samples: tuple[Sample, ...] | None
) -> tuple[str, str, str]:
    """The run's name, device and memory source: meta.json's, else from the path and samples."""
    if info is not None:
        return info.run_name, info.device, info.memory_source
    name = source.path.name if source.kind == "folder" else source.path.stem
    return name, "", _guess_source(samples)


def _meta(path: Path) -> RunInfo | None:
    if not path.is_file():
        return None
    try:
        return read_meta(path)
    except (ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{path} is not a valid run description ({exc})") from exc


def _guess_source(samples: tuple[Sample, ...] | None) -> str:
    # Without meta.json: the runner fills ``allocated`` only on CUDA.
    if samples and any(s.allocated is not None for s in samples):
        return "cuda allocator"
    return "process RSS" if samples else ""


def _read_timeline(
    rows: Iterator[TimelineRow], points: int, totals: LineTotals | None = None
) -> tuple[tuple[LabelPoint, ...], tuple[Sample, ...], int]:
    labels: list[LabelPoint] = []
    counted = [0]

    def samples() -> Iterator[Sample]:
        for row in rows:
            counted[0] += 1
            if totals is not None:
                totals.add(row)
            if row.event == "track":
                labels.append(
                    LabelPoint(row.label, row.elapsed, row.memory, row.file, row.function, row.line)
                )
            if row.memory is None:
                continue
            if row.peak is not None and row.peak > row.memory:
                # The transient peak inside this event, drawn just before its end value.
                yield Sample(row.elapsed, row.peak, allocated=row.peak if row.allocated is not None else None)
            yield Sample(row.elapsed, row.memory, row.allocated, row.reserved, row.driver, row.rss)

    kept = downsample(samples(), points)
    return tuple(labels), tuple(kept), counted[0]


def _load_tracker(path: Path, points: int) -> Run:
    labels: list[LabelPoint] = []
    devices: set[str] = set()
    counted = [0]
    notes: list[str] = []

    def samples() -> Iterator[Sample]:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = CompleteRows(handle)
            reader = csv.DictReader(rows)
            try:
                for stamp in stamps_from_rows(reader):
                    counted[0] += 1
                    sample, label = _tracker_point(stamp)
                    devices.add(stamp.ledger.device)
                    labels.append(label)
                    yield sample
            except (TypeError, AttributeError, KeyError, ValueError) as exc:
                raise ValueError(f"line {reader.line_num}: not a valid report row ({exc})") from exc
        notes.extend(note for note in [cut_note(path, rows)] if note is not None)

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
