"""What the HTML report shows, collected from the inputs as plain JSON-ready data.

``collect(paths)`` reads each input (a runner folder, one of its CSVs, a MemTracker CSV,
a launch folder of ``rank<k>/`` run folders, or a folder of the same layout such as a
``snapshot`` command's) and returns a dict the page embeds (``page.render_page``). Per run:

- ``kind``: ``"runner"``, ``"tracker"``, ``"snapshot"`` (a memory snapshot's analysis) or
  ``"launch"`` (no figures of its own: ``peak`` is its highest rank's, ``peak_rank`` that
  rank; ``launch`` holds the script, world size and the spread of the peaks);
- ``status``: ``"ok"``, ``"exit N"``, ``"no end"`` from ``meta.json`` (``""``: unknown);
- ``points``: the memory timeline ``[elapsed seconds, bytes, where]``, cut to at most
  ``2 * points`` by ``runfolder.read.downsample`` (each bucket keeps its lowest and highest
  value, so no peak is lost); a line's transient peak is drawn just before its end value,
  unless the lines it called drew it already (``runfolder.transients``);
- ``reserved``: the allocator's reserved bytes ``[elapsed, bytes]`` where recorded;
- ``labels``: the ``track()`` stamps ``[elapsed, bytes or None, label, where]``;
- ``lines``: the per-line records (``runfolder.records.LineRecord`` as dicts; with a
  snapshot analysis also ``phase``, ``live_at_peak`` and, for a snapshot, ``first`` and
  ``last``: seconds in the trace, see ``html.snapshot``);
- ``censuses``: the stamps of ``census.csv`` and ``tracker.csv`` (a MemTracker CSV's own
  stamps), each with its group changes, at most ``MAX_CENSUSES``;
- ``ranks``: one entry per rank of a launch (``ranks.csv``'s figures: status, peak, where,
  at the end, ``difference`` from rank 0's; and its timeline, labels and lines), none
  without ``rank<k>/`` subfolders;
- ``snapshot``: the allocator summary of a snapshot analysis (``html.snapshot``), or None.

With exactly two inputs, ``comparison`` holds ``runs.compare``'s rows (by line when both
runs have per-line records, else by label; a launch is compared by its first rank), and
when both are snapshot analyses ``snapshot_comparison`` holds their comparison line by
line and phase by phase (``html.snapshot.snapshot_comparison``; None otherwise). A
raw memory snapshot (``.pickle``, ``.pkl``, gzip-compressed or not) is analysed as the
``snapshot`` command does. All sizes are bytes of each run's memory source.
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
from ..runfolder.ranktable import read_launch
from ..runfolder.read import DEFAULT_POINTS, downsample
from ..runfolder.transients import PeakPlacer, raised_peaks
from ..runs.compare import Comparison, compare_runs
from ..runs.load import Run, Source, detect, load_run
from ..tracker.csvlog import read_stamps
from ..units import shape_text
from .snapshot import enrich_lines, line_times, read_analysis, snapshot_comparison, snapshot_summary

__all__ = ["MAX_CENSUSES", "MAX_CHANGES", "collect", "rank_folders"]

#: Censuses per run and group changes per census kept in the page.
MAX_CENSUSES, MAX_CHANGES = 200, 25

_SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz")
#: ``meta.json``'s engine in a ``snapshot`` report folder.
SNAPSHOT_ENGINE = "memory snapshot"


@dataclass(frozen=True)
class _Point:
    """One timeline point (``downsample`` keys on ``memory``)."""

    elapsed: float
    memory: int
    where: str


def collect(
    paths: Sequence[str | Path], points: int = DEFAULT_POINTS, max_bytes: int | None = None
) -> dict[str, Any]:
    """The report's data for ``paths`` (see the module docstring; a raw snapshot is read
    up to ``max_bytes`` bytes, None: ``snapshotfile.load.MAX_BYTES``); ``UsageError``
    (one line) for a missing or unreadable input."""
    if not paths:
        raise UsageError("give at least one run folder, CSV or snapshot folder")
    loaded = [_load(Path(path), points, max_bytes) for path in paths]
    data: dict[str, Any] = {
        "title": " vs ".join(run["name"] for run, _ in loaded),
        "version": __version__,
        "runs": [run for run, _ in loaded],
        "comparison": None,
        "notes": [note for _, run in loaded for note in run.notes],
    }
    analyses = [_take_analysis(run) for run, _ in loaded]
    data["snapshot_comparison"] = None
    if len(loaded) == 2:
        try:
            data["comparison"] = _comparison(loaded[0][1], loaded[1][1])
        except UsageError as exc:
            data["notes"].append(f"no comparison: {exc}")
    if len(loaded) == 2 and all(a is not None for a in analyses):
        names = [run["name"] for run, _ in loaded]
        try:
            data["snapshot_comparison"] = snapshot_comparison(analyses[0], analyses[1], *names)
        except UsageError as exc:
            data["notes"].append(f"no snapshot comparison: {exc}")
    return data


def _take_analysis(run: dict[str, Any]) -> dict[str, Any] | None:
    """A run's snapshot analysis, removed from its data: the page does not embed it whole
    (a rank's entry keeps only its figures, see ``_ranks``)."""
    return run.pop("analysis", None)


def rank_folders(path: Path) -> list[tuple[int, Path]]:
    """The ``rank<k>/`` subfolders of ``path`` (``ranks.rank_folders``) that hold a run, by rank."""
    return [(rank, folder) for rank, folder in launch_rank_folders(path).items() if _is_run(folder)]


def _load(path: Path, points: int, max_bytes: int | None = None) -> tuple[dict[str, Any], Run]:
    if path.is_file() and path.name.endswith(_SNAPSHOT_SUFFIXES):
        return _snapshot(path, points, max_bytes)
    ranks = rank_folders(path)
    if ranks and not _is_run(path):
        return _launch(path, ranks, points)
    data, run = _run(path, points)
    data["ranks"] = _ranks(path, ranks, points) if ranks else []
    return data, run


def _run(path: Path, points: int) -> tuple[dict[str, Any], Run]:
    """One run's data: a run folder, one of its CSVs or a MemTracker CSV."""
    source = detect(path)
    run = load_run(source, points=points)
    snapshot = run.info is not None and run.info.engine == SNAPSHOT_ENGINE
    data = {
        "name": run.name,
        "path": str(path),
        "kind": "snapshot" if snapshot else run.kind,
        "device": run.device,
        "memory_source": run.memory_source,
        "peak": run.peak,
        "status": _status(run),
        "events": run.events,
        "points": _points(source, run, points),
        "reserved": _reserved(source, run, points),
        "labels": [
            [p.elapsed, p.memory, p.label, _where(p.file, p.line, p.function)] for p in run.labels or ()
        ],
        "lines": [_known(record.to_dict()) for record in run.lines or ()],
        "censuses": _censuses(source),
        "ranks": [],
        "snapshot": None,
    }
    analysis = read_analysis(source.path) if source.kind == "folder" else None
    if analysis is not None:
        data["snapshot"] = snapshot_summary(analysis)
        data["analysis"] = analysis  # for a comparison of two snapshots; not embedded
        timeline = _timeline_file(source)
        times = line_times(read_timeline(timeline)) if snapshot and timeline is not None else None
        enrich_lines(data["lines"], analysis, times)
    return data, run


def _status(run: Run) -> str:
    """``"ok"``, ``"exit N"``, ``"no end"`` (killed, or still running) from ``meta.json``;
    ``""`` where there is none (a MemTracker CSV, a snapshot)."""
    info = run.info
    if info is None or info.engine == SNAPSHOT_ENGINE:
        return ""
    if info.ended is None or info.exit_code is None:
        return "no end"
    return "ok" if info.exit_code == 0 else f"exit {info.exit_code}"


def _launch(path: Path, ranks: list[tuple[int, Path]], points: int) -> tuple[dict[str, Any], Run]:
    """A launch folder: no figures of its own, its ranks side by side (the ``Run`` given
    back for a comparison is its first rank's)."""
    ranked = _ranks(path, ranks, points)
    first = load_run(ranks[0][1], points=points)
    known = [r for r in ranked if r["peak"] is not None]
    top = max(known, key=lambda r: r["peak"], default=None)
    summary = read_launch(path)
    data = {
        "name": path.name,
        "path": str(path),
        "kind": "launch",
        "device": ", ".join(sorted({r["device"] for r in ranked if r["device"]})),
        "memory_source": first.memory_source,
        "peak": None if top is None else top["peak"],
        "peak_rank": None if top is None else top["rank"],
        "status": _launch_status(ranked),
        "events": sum(r["events"] for r in ranked),
        "points": [],
        "reserved": [],
        "labels": [],
        "lines": [],
        "censuses": [],
        "ranks": ranked,
        "snapshot": None,
        "launch": {
            "script": summary.script,
            "world_size": summary.world_size,
            "spread": summary.spread,
            "spread_text": _spread_text(known),
        },
    }
    return data, first


def _ranks(path: Path, ranks: list[tuple[int, Path]], points: int) -> list[dict[str, Any]]:
    """Every rank of the launch in ``path`` (missing ones too): its ``ranks.csv`` figures
    (status, peak, where and in which phase, memory at the end, peak minus rank 0's) and
    its run's timeline and lines."""
    folders = dict(ranks)
    summary = read_launch(path)
    base = summary.ranks[0].peak if summary.ranks else None
    out = []
    for rank in summary.ranks:
        entry: dict[str, Any] = {**rank.to_dict(), "name": f"rank {rank.rank}"}
        entry["difference"] = None if rank.peak is None or base is None else rank.peak - base
        run: dict[str, Any] = {"points": [], "reserved": [], "labels": [], "lines": [], "events": 0}
        if rank.rank in folders:
            run, _ = _run(folders[rank.rank], max(1, points // 2))
        for key in ("points", "reserved", "labels", "lines", "events"):
            entry[key] = run[key]
        out.append(entry)
    return out


def _launch_status(ranks: list[dict[str, Any]]) -> str:
    statuses = sorted({r["status"] for r in ranks})
    return statuses[0] if len(statuses) == 1 else ", ".join(statuses)


def _spread_text(ranks: list[dict[str, Any]]) -> str:
    """Largest peak over smallest, naming both ranks (ties: "every rank equal")."""
    positive = [r for r in ranks if r["peak"]]
    if len(positive) < 2:
        return ""
    high = max(positive, key=lambda r: r["peak"])
    low = min(positive, key=lambda r: r["peak"])
    if high["peak"] == low["peak"]:
        return "1.000 (every rank's peak is equal)"
    return f"{high['peak'] / low['peak']:.3f} (rank {high['rank']} / rank {low['rank']})"


def _snapshot(path: Path, points: int, max_bytes: int | None) -> tuple[dict[str, Any], Run]:
    """A raw memory snapshot: analysed as the ``snapshot`` command does, into a folder
    that lives only while it is read."""
    import tempfile

    from ..snapshots.folder import load_checked, report_folder

    snapshot = load_checked(path, max_bytes)
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
    timeline = _timeline_file(source)
    if timeline is not None:
        raised = raised_peaks(read_timeline(timeline))
        kept = downsample(_timeline_points(timeline, raised), points)
        return [[p.elapsed, p.memory, p.where] for p in kept]
    return [
        [p.elapsed, p.memory, _where(p.file, p.line, p.function)]
        for p in run.labels or ()
        if p.memory is not None
    ]


def _reserved(source: Source, run: Run, points: int) -> list[list[Any]]:
    """The allocator's reserved bytes over time ``[elapsed, bytes]``, where recorded."""
    timeline = _timeline_file(source)
    if timeline is None:
        rows = [(s.elapsed, s.reserved) for s in run.samples or ()]
    else:
        rows = [(row.elapsed, row.reserved) for row in read_timeline(timeline)]
    known = (_Point(elapsed, value, "") for elapsed, value in rows if value is not None)
    return [[p.elapsed, p.memory] for p in downsample(known, points)]


def _timeline_file(source: Source) -> Path | None:
    timeline = RunFolder(source.path).timeline if source.kind == "folder" else source.path
    return timeline if source.kind in ("folder", "timeline") and timeline.is_file() else None


def _timeline_points(path: Path, raised: dict[int, int]) -> Iterator[_Point]:
    placer = PeakPlacer(raised)
    for index, row in enumerate(read_timeline(path)):
        transient = placer.place(index, row)
        if row.memory is None:
            continue
        where = _where(row.file, row.line, row.function) if row.event == "line" else row.event
        if row.label:
            where += f" [{row.label}]"
        if transient is not None:
            yield _Point(row.elapsed, transient, where + " (peak while it ran)")
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
