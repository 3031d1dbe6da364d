"""What the HTML report shows, collected from the inputs as plain JSON-ready data.

``collect(paths)`` reads each input (a runner folder, one of its CSVs, a MemTracker CSV,
or a folder of the same layout such as a ``snapshot`` command's) and returns a dict the
page embeds (``page.render_page``). Per run:

- ``points``: the memory timeline ``[elapsed seconds, bytes, where]``, cut to at most
  ``2 * points`` by ``runfolder.read.downsample`` (each bucket keeps its lowest and highest
  value, so no peak is lost); a line's transient peak is drawn just before its end value;
- ``labels``: the ``track()`` stamps ``[elapsed, bytes or None, label, where]``;
- ``lines``: the per-line records (``runfolder.records.LineRecord`` as dicts);
- ``censuses``: the stamps of ``census.csv`` and ``tracker.csv`` (a MemTracker CSV's own
  stamps), each with its group changes, at most ``MAX_CENSUSES``;
- ``ranks``: one entry per ``rank<k>/`` subfolder that is a run (none when absent).

With exactly two inputs, ``comparison`` holds ``runs.compare``'s rows (by line when both
runs have per-line records, else by label). A raw memory snapshot (``.pickle``, ``.pkl``,
gzip-compressed or not) is analysed as the ``snapshot`` command does. All sizes are bytes
of each run's memory source.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import UsageError
from ..ranks import rank_folders as launch_rank_folders
from ..runfolder.files import RunFolder, read_timeline
from ..runfolder.read import DEFAULT_POINTS, downsample
from ..runs.compare import Comparison, compare_runs
from ..runs.load import Run, Source, detect, load_run
from ..tracker.csvlog import read_stamps
from ..units import shape_text

__all__ = ["MAX_CENSUSES", "MAX_CHANGES", "collect", "rank_folders"]

#: Censuses per run and group changes per census kept in the page.
MAX_CENSUSES, MAX_CHANGES = 200, 25

_SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz")


@dataclass(frozen=True)
class _Point:
    """One timeline point (``downsample`` keys on ``memory``)."""

    elapsed: float
    memory: int
    where: str


def collect(paths: Sequence[str | Path], points: int = DEFAULT_POINTS) -> dict[str, Any]:
    """The report's data for ``paths`` (see the module docstring); ``UsageError`` (one
    line) for a missing or unreadable input."""
    if not paths:
        raise UsageError("give at least one run folder, CSV or snapshot folder")
    loaded = [_load(Path(path), points) for path in paths]
    data: dict[str, Any] = {
        "title": " vs ".join(run["name"] for run, _ in loaded),
        "version": __version__,
        "runs": [run for run, _ in loaded],
        "comparison": None,
        "notes": [note for _, run in loaded for note in run.notes],
    }
    if len(loaded) == 2:
        try:
            data["comparison"] = _comparison(loaded[0][1], loaded[1][1])
        except UsageError as exc:
            data["notes"].append(f"no comparison: {exc}")
    return data


def rank_folders(path: Path) -> list[tuple[int, Path]]:
    """The ``rank<k>/`` subfolders of ``path`` (``ranks.rank_folders``) that hold a run, by rank."""
    return [(rank, folder) for rank, folder in launch_rank_folders(path).items() if _is_run(folder)]


def _load(path: Path, points: int) -> tuple[dict[str, Any], Run]:
    if path.is_file() and path.name.endswith(_SNAPSHOT_SUFFIXES):
        return _snapshot(path, points)
    ranks = rank_folders(path)
    main = path if not ranks or _is_run(path) else ranks[0][1]
    source = detect(main)
    run = load_run(source, points=points)
    data = {
        "name": run.name if main == path else path.name,
        "path": str(path),
        "kind": run.kind,
        "device": run.device,
        "memory_source": run.memory_source,
        "peak": run.peak,
        "events": run.events,
        "points": _points(source, run, points),
        "labels": [
            [p.elapsed, p.memory, p.label, _where(p.file, p.line, p.function)] for p in run.labels or ()
        ],
        "lines": [_known(record.to_dict()) for record in run.lines or ()],
        "censuses": _censuses(source),
        "ranks": [_rank(rank, folder, points) for rank, folder in ranks],
    }
    return data, run


def _snapshot(path: Path, points: int) -> tuple[dict[str, Any], Run]:
    """A raw memory snapshot: analysed as the ``snapshot`` command does, into a folder
    that lives only while it is read."""
    import tempfile

    from ..snapshots.command import load_checked, report_folder

    snapshot = load_checked(path)
    with tempfile.TemporaryDirectory(prefix="gpu_mem_track-html-") as scratch:
        folder, _ = report_folder(snapshot, Path(scratch))
        data, run = _load(folder, points)
    data["path"] = str(path)
    return data, run


def _known(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with NaN or infinite figures as None (unknown): lines rebuilt from a
    killed run's timeline have no ``seconds``, and JSON has no NaN."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()}


def _is_run(path: Path) -> bool:
    folder = RunFolder(path)
    return any(p.is_file() for p in (folder.meta, folder.lines, folder.timeline))


def _points(source: Source, run: Run, points: int) -> list[list[Any]]:
    """The timeline with where each point was taken; a MemTracker CSV's from its stamps."""
    timeline = RunFolder(source.path).timeline if source.kind == "folder" else source.path
    if source.kind in ("folder", "timeline") and timeline.is_file():
        kept = downsample(_timeline_points(timeline), points)
        return [[p.elapsed, p.memory, p.where] for p in kept]
    return [
        [p.elapsed, p.memory, _where(p.file, p.line, p.function)]
        for p in run.labels or ()
        if p.memory is not None
    ]


def _timeline_points(path: Path) -> Iterator[_Point]:
    for row in read_timeline(path):
        if row.memory is None:
            continue
        where = _where(row.file, row.line, row.function) if row.event == "line" else row.event
        if row.label:
            where += f" [{row.label}]"
        if row.peak is not None and row.peak > row.memory:
            yield _Point(row.elapsed, row.peak, where + " (peak while it ran)")
        yield _Point(row.elapsed, row.memory, where)


def _censuses(source: Source) -> list[dict[str, Any]]:
    """The stamps with their changes: the run folder's ``census.csv`` and ``tracker.csv``
    (the folder of a ``lines.csv`` or ``timeline.csv`` given directly), or the MemTracker
    CSV itself."""
    if source.kind == "tracker":
        files = [source.path]
    else:
        folder = source.path if source.kind == "folder" else source.path.parent
        files = [folder / "census.csv", folder / "tracker.csv"]
    out: list[dict[str, Any]] = []
    for path in files:
        if not path.is_file():
            continue
        try:
            stamps = read_stamps(path)
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{path} is not a valid MemTracker CSV ({exc})") from exc
        out.extend(_census(path.stem, stamp) for stamp in stamps if stamp.changes)
    out.sort(key=lambda census: census["elapsed"])
    return out[:MAX_CENSUSES]


def _census(origin: str, stamp: Any) -> dict[str, Any]:
    return {
        "origin": origin,
        "seq": stamp.seq,
        "elapsed": stamp.elapsed,
        "where": _where(stamp.file, stamp.line, stamp.function),
        "label": stamp.label,
        "tensors": stamp.ledger.tensors,
        "changes": [
            {
                "kind": c.kind,
                "shape": shape_text(c.shape),
                "dtype": c.dtype.replace("torch.", ""),
                "count_delta": c.count_delta,
                "bytes_delta": c.bytes_delta,
                "names": list(c.names[:8]),
            }
            for c in stamp.changes[:MAX_CHANGES]
        ],
        "more_changes": max(0, len(stamp.changes) - MAX_CHANGES),
    }


def _rank(rank: int, folder: Path, points: int) -> dict[str, Any]:
    run = load_run(folder, lines=False, points=max(1, points // 4))
    samples = [[s.elapsed, s.memory] for s in run.samples or ()]
    return {"rank": rank, "name": run.name, "device": run.device, "peak": run.peak, "points": samples}


def _comparison(a: Run, b: Run) -> dict[str, Any]:
    by = "line" if a.lines and b.lines else "label"
    comparison: Comparison = compare_runs(a, b, by)
    return {
        "by": by,
        "a": a.name,
        "b": b.name,
        "peak_a": a.peak,
        "peak_b": b.peak,
        "rows": [
            {
                "key": " ".join(row.key) + (f" #{row.occurrence}" if row.occurrence > 1 else ""),
                "a": None if row.a is None else row.a.value,
                "b": None if row.b is None else row.b.value,
                "difference": row.difference,
                "peak_difference": row.peak_difference,
            }
            for row in comparison.rows
        ],
    }


def _where(file: str, line: int | None, function: str) -> str:
    name = os.path.basename(file) if file else "?"
    return f"{name}:{line if line is not None else '?'} {function}".strip()
