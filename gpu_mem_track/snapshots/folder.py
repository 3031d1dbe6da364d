"""Write a snapshot's analysis as a runner folder, so ``compare`` and ``plot`` read it:
``report_folder`` analyses a snapshot (``load_checked`` reads it) and writes its folder,
for the ``snapshot`` command and the HTML page alike.

``reports/<name>/`` holds, in the runner's formats (``runfolder.files``):

- ``meta.json``: a ``RunInfo`` (``script``: the snapshot file, ``engine``:
  ``"memory snapshot"``, ``memory_source``: ``"cuda allocator"``, ``started``/``ended``:
  the trace's first and last times in epoch seconds, ``exit_code`` empty, ``peak`` and
  ``peak_at``);
- ``lines.csv``: one row per site: ``hits`` allocations, ``memory`` allocated bytes
  after its last allocation or free, ``increment`` bytes allocated minus freed there,
  ``peak`` the highest allocated bytes right after one of its allocations (exact;
  without a trace, the snapshot's figure, marked as a lower bound), ``seconds`` 0 (not
  recorded); the ``<before recording>`` row's increment, memory and peak are what was
  allocated when the trace starts (its peak a lower bound), so the increments add up to
  the final allocated bytes;
- ``timeline.csv``: ``start``, one ``line`` row per event that changed allocated or
  reserved bytes (``label``: the trace action; ``elapsed``: seconds since the trace's
  first entry), ``track`` rows for ``empty_cache()`` runs and out-of-memory errors, ``end``;
- ``report.txt``: ``report.render_report``;

and two files of its own: ``snapshot.json`` (``SnapshotAnalysis.to_dict``) and
``snapshot_lines.csv`` (``SNAPSHOT_LINE_COLUMNS``: every ``LineUsage`` field).
"""

from __future__ import annotations

import csv
import json
import platform
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..allocator.replay import Replay, replay
from ..errors import BadInput, TooLarge, UsageError
from ..outputs import claim_folder, safe_name
from ..runfolder.files import TIMELINE_COLUMNS, RunFolder, write_lines, write_meta
from ..runfolder.records import LineRecord, RunInfo
from ..snapshotfile.load import load_snapshot
from ..snapshotfile.records import Snapshot
from .analyse import LineUsage, SnapshotAnalysis, analyse, pick_device
from .attribution import PRE_TRACE, Attributor
from .phases import TraceReading, read_trace
from .report import render_report

__all__ = [
    "SNAPSHOT_LINE_COLUMNS",
    "default_name",
    "line_records",
    "load_checked",
    "report_folder",
    "write_folder",
    "write_snapshot_files",
]

SNAPSHOT_LINE_COLUMNS = tuple(LineUsage.__dataclass_fields__)
_SUFFIXES = (".gz", ".pickle", ".pkl", ".pck")


def default_name(path: str | Path) -> str:
    """The folder name for a snapshot file: its name without ``.pickle``/``.gz``."""
    name = Path(path).name
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return safe_name(name or "snapshot")


def load_checked(path: Path, max_bytes: int | None = None) -> Snapshot:
    """The snapshot in ``path``, read up to ``max_bytes`` bytes on disk and once gunzipped
    (None: ``snapshotfile.load.MAX_BYTES``, 4 GiB); ``UsageError`` (one line) when it is
    missing or not one, and when it is larger, saying how to read more (``--max-bytes``)."""
    if not path.exists():
        raise UsageError(f"no such snapshot: {path}")
    try:
        return load_snapshot(path, max_bytes)
    except TooLarge as exc:
        raise BadInput(f"{exc}; --max-bytes SIZE (e.g. 8GiB) reads larger snapshots") from None


def report_folder(
    snapshot: Snapshot,
    out_dir: Path,
    name: str | None = None,
    include: Sequence[str] = (),
    device: int | None = None,
    top: int = 10,
) -> tuple[Path, SnapshotAnalysis]:
    """Analyse ``snapshot`` (``device``: its CUDA index, default the one with the longest
    trace; ``include``: more paths counted as user code) and write its runner-style folder
    ``out_dir/name`` (default name: the file's, made unique); returns the folder and the
    analysis. ``UsageError`` for a device the snapshot lacks or a folder it cannot write."""
    chosen = pick_device(snapshot, device)
    if device is not None and chosen not in snapshot.devices():
        found = ", ".join(str(d) for d in snapshot.devices()) or "none"
        raise UsageError(f"{snapshot.source}: no device {chosen} in the snapshot (devices: {found})")
    attributor = Attributor(include)
    replayed = replay(snapshot, chosen)
    reading = read_trace(snapshot.device_trace(chosen), attributor)
    analysis = analyse(snapshot, replayed, attributor, reading)
    folder = RunFolder(claim_folder(Path(out_dir), safe_name(name or default_name(snapshot.source))))
    write_folder(folder, analysis, replayed, attributor, top, reading)
    return folder.path, analysis


def line_records(analysis: SnapshotAnalysis) -> list[LineRecord]:
    """The runner's per-line records of an analysis (see the module docstring)."""
    exact = analysis.has_trace
    return [
        LineRecord(
            file=u.file,
            function=u.function,
            line=u.line,
            code=u.code,
            hits=u.hits,
            memory=u.memory,
            increment=u.allocated - u.freed,
            peak=u.peak,
            peak_exact=exact and u.site != PRE_TRACE,
            seconds=0.0,
        )
        for u in analysis.lines
    ]


def write_folder(
    folder: RunFolder,
    analysis: SnapshotAnalysis,
    replayed: Replay,
    attributor: Attributor,
    top: int = 10,
    reading: TraceReading | None = None,
) -> None:
    """Write every file of the folder (which exists); ``reading``: the trace read in
    order, as the analysis read it (``phases.read_trace``), for the timeline's lines."""
    name = folder.path.name
    try:
        write_meta(folder.meta, _info(analysis, name))
        write_lines(folder.lines, line_records(analysis))
        _write_timeline(folder.timeline, analysis, replayed, attributor, reading)
        write_snapshot_files(folder.path, analysis)
        folder.report.write_text(render_report(analysis, name, top), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write reports to {folder.path}: {exc.strerror or exc}") from exc


def write_snapshot_files(path: Path, analysis: SnapshotAnalysis) -> None:
    """Write the snapshot's own two files into the folder ``path``: ``snapshot_lines.csv``
    and ``snapshot.json`` (also used by ``run --snapshot``)."""
    _write_snapshot_lines(path / "snapshot_lines.csv", analysis)
    (path / "snapshot.json").write_text(json.dumps(analysis.to_dict(), indent=2) + "\n", encoding="utf-8")


def _info(analysis: SnapshotAnalysis, name: str) -> RunInfo:
    start = analysis.time_start_us / 1e6 if analysis.time_start_us is not None else 0.0
    end = analysis.time_end_us / 1e6 if analysis.time_end_us is not None else None
    peak = analysis.peak
    return RunInfo(
        run_name=name,
        script=analysis.source,
        argv=(analysis.source,),
        device=f"cuda:{analysis.device}",
        memory_source="cuda allocator",
        engine="memory snapshot",
        started=start,
        python=platform.python_version(),
        torch="",
        gpu_mem_track=__version__,
        ended=end,
        exit_code=None,
        peak=peak.allocated,
        peak_at=peak.site.label if peak.site.line == 0 else f"{peak.site.file}:{peak.site.line}",
    )


def _write_timeline(
    path: Path,
    analysis: SnapshotAnalysis,
    replayed: Replay,
    attributor: Attributor,
    reading: TraceReading | None,
) -> None:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(TIMELINE_COLUMNS)
        width = len(TIMELINE_COLUMNS)  # the rank column: empty (no distributed launch)
        rows = _timeline_rows(analysis, replayed, attributor, reading)
        writer.writerows(row + [None] * (width - len(row)) for row in rows)


def _timeline_rows(
    analysis: SnapshotAnalysis, replayed: Replay, attributor: Attributor, reading: TraceReading | None = None
) -> Iterator[list[Any]]:
    """Rows in ``TIMELINE_COLUMNS`` order (see the module docstring)."""
    t0 = analysis.time_start_us
    allocated, reserved = replayed.start_allocated, replayed.start_reserved
    seq, elapsed = 0, 0.0
    yield _mark(seq, elapsed, "start", "", allocated, reserved, analysis.source)
    marks = {at for at, _, _ in analysis.empty_cache}
    for step in replayed.steps:
        entry = step.entry
        seq += 1
        elapsed = (entry.time_us - t0) / 1e6 if t0 is not None and entry.time_us else float(step.index)
        if entry.action == "oom" or (
            entry.action in ("segment_free", "segment_unmap") and entry.time_us in marks
        ):
            marks.discard(entry.time_us)
            label = "out of memory" if entry.action == "oom" else "empty_cache()"
            yield _mark(seq, elapsed, "track", label, allocated, reserved)
            seq += 1
        owner = reading.owners.get(step.index) if reading is not None else None
        site = owner if owner is not None else attributor.describe(entry.frames)[0]
        allocated, reserved = step.allocated, step.reserved
        increment = step.bytes if entry.action in ("alloc", "free_requested") else 0
        yield [
            seq, elapsed, "line", site.file, site.function, site.line or None, entry.action,
            allocated, increment, None, allocated, reserved, None, None,
        ]  # fmt: skip
    yield _mark(seq + 1, elapsed, "end", "", allocated, reserved)


def _mark(
    seq: int, elapsed: float, event: str, label: str, allocated: int, reserved: int, file: str = ""
) -> list:
    """A row that is not a trace event: the start, the end, a ``track`` label."""
    return [
        seq,
        elapsed,
        event,
        file,
        "",
        None,
        label,
        allocated,
        None,
        None,
        allocated,
        reserved,
        None,
        None,
    ]


def _write_snapshot_lines(path: Path, analysis: SnapshotAnalysis) -> None:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(SNAPSHOT_LINE_COLUMNS)
        for usage in analysis.lines:
            writer.writerow([getattr(usage, name) for name in SNAPSHOT_LINE_COLUMNS])
