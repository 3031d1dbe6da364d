"""Read a run folder back: its ``meta.json`` (``read_info``), its timeline as a memory
series and ``track()`` labels (``read_series``, streamed and downsampled), and the one
error policy for what a report file may raise (``reading``). The per-line CSV is read by
``files.read_lines``; a folder without one has its lines rebuilt (``rebuild``).

Memory is in bytes of the run's *memory source* (``RunInfo.memory_source``). Nothing
here imports torch or any part of the package that measures.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from .files import read_meta
from .rebuild import LineTotals
from .records import RunInfo, TimelineRow
from .transients import PeakPlacer

__all__ = [
    "DEFAULT_POINTS",
    "LabelPoint",
    "Sample",
    "downsample",
    "guess_source",
    "read_info",
    "read_series",
    "reading",
]

#: Default cap on the time series' buckets; each keeps its lowest and highest sample,
#: so a series has at most twice this many points.
DEFAULT_POINTS = 2000


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


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Turn what reading the report at ``path`` may raise (a bad row, bad text, an OS
    error) into a one-line ``errors.BadInput`` naming the file (a ``BadInput`` that says
    the file is not a regular one, or is missing, passes unchanged)."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path} is not a text report ({exc.reason})") from None
    except BadInput as exc:
        if ", line " not in str(exc):
            raise
        raise BadInput(f"not a valid report: {exc}") from None
    except (ValueError, KeyError, csv.Error) as exc:
        text = str(exc)  # the readers' messages name the file and line already
        raise BadInput(
            f"not a valid report: {text}" if str(path) in text else f"{path} is not a valid report: {text}"
        ) from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None


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


def read_info(path: Path) -> RunInfo | None:
    """``meta.json`` at ``path`` (None when there is none); ``errors.BadInput`` (one line)
    when it is not a valid run description (``files.read_meta``)."""
    if not path.exists():
        return None
    return read_meta(path)


def guess_source(samples: tuple[Sample, ...] | None) -> str:
    """The memory source of a run without ``meta.json``, from its samples."""
    # Without meta.json: the runner fills ``allocated`` only on CUDA.
    if samples and any(s.allocated is not None for s in samples):
        return "cuda allocator"
    return "process RSS" if samples else ""


def read_series(
    rows: Iterator[TimelineRow],
    points: int,
    totals: LineTotals | None = None,
    raised: dict[int, int] | None = None,
) -> tuple[tuple[LabelPoint, ...], tuple[Sample, ...], int]:
    """The ``track()`` labels, the memory series cut to at most ``2 * points`` samples
    (``downsample``) and the number of rows read, from a timeline's ``rows``; each row
    also goes to ``totals`` when given (lines rebuilt from the timeline). A line's
    transient peak is drawn just before its end value where it happened (``transients``;
    ``raised``: ``transients.raised_peaks`` of the same rows, read beforehand)."""
    labels: list[LabelPoint] = []
    counted = [0]
    placer = PeakPlacer(raised)

    def samples() -> Iterator[Sample]:
        for index, row in enumerate(rows):
            counted[0] += 1
            if totals is not None:
                totals.add(row)
            if row.event == "track":
                labels.append(
                    LabelPoint(row.label, row.elapsed, row.memory, row.file, row.function, row.line)
                )
            transient = placer.place(index, row)
            if row.memory is None:
                continue
            if transient is not None:  # drawn just before the row's end value
                allocated = transient if row.allocated is not None else None
                yield Sample(row.elapsed, transient, allocated=allocated)
            yield Sample(row.elapsed, row.memory, row.allocated, row.reserved, row.driver, row.rss)

    kept = downsample(samples(), points)
    return tuple(labels), tuple(kept), counted[0]
