"""The runner's files: a run folder, its per-line CSV, its streamed timeline CSV, its
``meta.json``.

A run folder ``reports/<run name>/`` holds:

- ``meta.json``: the ``records.RunInfo`` (written when the run starts, rewritten at its end);
- ``lines.csv``: one row per traced source line, columns ``LINE_COLUMNS`` (see
  ``records.LineRecord``), written at the end of the run; files written before ``rise``
  existed lack that column and still read;
- ``timeline.csv``: one row per event, columns ``TIMELINE_COLUMNS`` (see
  ``records.TimelineRow``), streamed while the script runs;
- ``report.txt``: the text report (``render``);
- ``tracker.log`` and ``tracker.csv``: the stamps of ``MemTracker.track()`` calls in the
  script; ``census.log`` and ``census.csv``: the automatic censuses (``csvlog``'s format).

All sizes are raw bytes; empty cells are unknown values.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from .. import inputs
from ..csvrows import CompleteRows, LinedRows, cell_text, cut_note, open_csv
from ..errors import BadInput
from ..levers.records import LeverReport
from .records import LineRecord, RunInfo, SimulationInfo, StopInfo, TimelineRow

__all__ = [
    "LINE_COLUMNS",
    "LINE_REQUIRED",
    "TIMELINE_COLUMNS",
    "TIMELINE_REQUIRED",
    "RunFolder",
    "TimelineWriter",
    "csv_line",
    "read_lines",
    "replace_text",
    "read_meta",
    "read_timeline",
    "write_lines",
    "write_meta",
]

#: Columns of ``lines.csv``: the fields of ``records.LineRecord``, in order.
LINE_COLUMNS = tuple(f.name for f in fields(LineRecord))
#: The columns every ``lines.csv`` has (fields without a default); files written before
#: a later field (``rise``) existed lack it and still read.
LINE_REQUIRED = tuple(f.name for f in fields(LineRecord) if f.default is MISSING)
#: Columns of ``timeline.csv``: the fields of ``records.TimelineRow``, in order. The hot
#: path (``profiler.LineProfiler._line_row``) formats its rows by hand in this order.
TIMELINE_COLUMNS = tuple(f.name for f in fields(TimelineRow))
#: Columns a file written before they existed may lack (they read back as None).
_OPTIONAL = frozenset({"rank"})
#: The columns a ``timeline.csv`` of any version has.
TIMELINE_REQUIRED = tuple(c for c in TIMELINE_COLUMNS if c not in _OPTIONAL)
#: How a cell of each column reads back, by the field's declared type; text otherwise.
_PARSE: dict[str, Any] = {
    f.name: {
        "int": inputs.parse_int,
        "int | None": inputs.parse_int,
        "float": inputs.parse_float,
        "bool": lambda text: _BOOLS[text],
    }.get(str(f.type), str)
    for f in fields(LineRecord) + fields(TimelineRow)
}
_BOOLS = {"True": True, "False": False}
_TEXT = {name for name, parse in _PARSE.items() if parse is str}


def _needed(record: type) -> frozenset[str]:
    """The columns of ``record`` that must hold a value in every row: a number or a flag
    without a default (text may be empty)."""
    return frozenset(f.name for f in fields(record) if f.default is MISSING and f.name not in _TEXT)


class RunFolder:
    """The paths of one run folder (nothing is created until asked)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.meta = self.path / "meta.json"
        self.lines = self.path / "lines.csv"
        self.timeline = self.path / "timeline.csv"
        self.report = self.path / "report.txt"


class TimelineWriter:
    """Streams timeline rows to CSV, flushed at least every ``flush_seconds`` and on
    ``close()``, so a long run keeps nothing per event in memory.

    Rows wait in a short list written with ``os.write``; no Python file object is
    involved, so a forked child that calls ``discard()`` can never write our rows twice.
    Creating the file may raise ``OSError``; after that nothing does (its writes run inside
    the user's script): the first write error is kept in ``error``, what was written stays
    (a last row cut short reads as such), and later rows are dropped.
    """

    def __init__(self, path: Path, flush_seconds: float = 1.0) -> None:
        self.path = path
        self.error: OSError | None = None
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._pending: list[str] = [csv_line(TIMELINE_COLUMNS)]
        self._flush_seconds = flush_seconds
        self._flushed = time.monotonic()
        self.flush()
        if self.error is not None:
            raise self.error

    def write(self, values: Sequence[Any]) -> None:
        """One row, values in ``TIMELINE_COLUMNS`` order (None for unknown)."""
        self.write_text(csv_line(values))

    def write_row(self, row: TimelineRow) -> None:
        """One row from its record."""
        self.write_text(csv_line([getattr(row, name) for name in TIMELINE_COLUMNS]))

    def write_text(self, line: str) -> None:
        """One row already formatted as CSV, ending with a newline (the hot path)."""
        self._pending.append(line)
        if time.monotonic() - self._flushed >= self._flush_seconds:
            self.flush()

    def appender(self) -> tuple[list[str], Callable[[], None], float]:
        """For a native writer of rows (the runner's line sink, ``native/line_sink.cpp``):
        the list rows wait in (append each row, formatted as for ``write_text``; the list is
        never replaced), ``flush``, and the seconds within which to call ``flush`` after a
        row is appended (``flush_seconds``)."""
        return self._pending, self.flush, self._flush_seconds

    def flush(self) -> None:
        data = "".join(self._pending)
        self._pending.clear()
        self._flushed = time.monotonic()
        if self._fd is not None and data:
            view = memoryview(data.encode("utf-8"))
            try:
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as exc:  # a full disk: keep what is written, write no more
                self.error = exc
                self.close()

    def close(self) -> None:
        fd = self._fd
        if fd is not None:
            self.flush()
            self._fd = None
            try:
                os.close(fd)
            except OSError as exc:  # a network file system reports a failed write here
                self.error = self.error or exc

    def discard(self) -> None:
        """Forget the pending rows and write nothing more (in a forked child)."""
        self._pending.clear()
        self._fd = None


def csv_line(values: Sequence[Any]) -> str:
    """``values`` as one CSV line with its newline (None as an empty cell)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(_cells(values))
    return buffer.getvalue()


def _cells(values: Sequence[Any]) -> list[Any]:
    """Text cut to what a reader reads back (``csvrows.cell_text``)."""
    return [cell_text(v) if isinstance(v, str) else v for v in values]


def write_lines(path: Path, records: Sequence[LineRecord]) -> None:
    """Write ``lines.csv`` atomically (see ``replace_text``), one row per record, in file
    and line order."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(LINE_COLUMNS)
    for record in sorted(records, key=lambda r: (r.file, r.line)):
        writer.writerow(_cells([getattr(record, name) for name in LINE_COLUMNS]))
    replace_text(path, buffer.getvalue())


def read_lines(path: Path, notes: list[str] | None = None) -> list[LineRecord]:
    """The records of a ``lines.csv``; ``ValueError`` naming the file if it is not one.
    A last row cut mid-write is left out (``notes``, when given, receives one line)."""
    return [
        LineRecord.from_dict(row)
        for row in _typed_rows(path, LINE_REQUIRED, notes, LINE_COLUMNS[len(LINE_REQUIRED) :], LineRecord)
    ]


def read_timeline(path: Path, notes: list[str] | None = None) -> Iterator[TimelineRow]:
    """The rows of a ``timeline.csv``, one at a time (``ValueError`` if it is not one).
    A last row cut mid-write is left out (``notes``, when given, receives one line)."""
    for row in _typed_rows(path, TIMELINE_COLUMNS, notes, (), TimelineRow):
        yield TimelineRow.from_dict(row)


def write_meta(path: Path, info: RunInfo) -> None:
    """Write ``meta.json`` atomically (a crash leaves the previous version)."""
    replace_text(path, json.dumps(info.to_dict(), indent=2) + "\n")


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` atomically: through ``<name>.partial``, then renamed over it. On an
    ``OSError`` (a full disk) the partial file is removed and ``path`` is as it was."""
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        partial.replace(path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise


def read_meta(path: Path) -> RunInfo:
    """The ``RunInfo`` of a ``meta.json``; ``errors.BadInput`` (one line) if it is not one:
    not a regular file, over ``inputs.MAX_JSON_BYTES``, nested too deep, not JSON, or a
    field of the wrong type (``inputs.typed_fields``; a simulated run's ``simulation``,
    an early stop's ``stopped`` and ``run --lever``'s ``levers`` with the keys their
    reports read)."""
    what = "a gpu_mem_track run description"
    data = inputs.load_json(path, what)
    if not isinstance(data, dict) or data.get("format") != "gpu_mem_track run":
        raise BadInput(f"{path} is not {what}")
    flat = {key: value for key, value in data.items() if key not in _NESTED}
    info = RunInfo(**inputs.typed_fields(RunInfo, flat, str(path)))
    simulation, stopped, where = data.get("simulation"), data.get("stopped"), str(path)
    return replace(
        info,
        simulation=None if simulation is None else _simulation(simulation, where),
        stopped=None if stopped is None else _stopped(stopped, where),
        levers=_levers(data.get("levers") or [], where),
    )


#: ``RunInfo``'s fields holding records of their own (``run --simulate``, the stop rule,
#: ``run --lever``).
_NESTED = ("simulation", "stopped", "levers")
#: What the report reads of a simulated run's records: the keys each needs, with types.
_GPU_KEYS = {"name": str, "total_memory": int, "context_bytes": int, "cublas_workspace": int}
_READ_KEYS = {"filename": str, "line": int, "op": str, "count": int}
_BOUND_KEYS = {**_READ_KEYS, "bound": int}
_COMPILED_KEYS = {"filename": str, "line": int, "api": str, "backend": str, "mode": str, "count": int}
_OOM_KEYS = {"filename": str, "line": int, "request": int, "allocated": int, "reserved": int, "capacity": int}


def _simulation(value: Any, where: str) -> SimulationInfo:
    """A ``meta.json``'s ``simulation``, checked: ``BadInput`` naming what is wrong."""
    data = _mapping(value, where, "simulation")
    gpu = _keyed(data.get("gpu"), _GPU_KEYS, where, "simulation.gpu")
    reads = [
        _keyed(r, _READ_KEYS, where, "simulation.placeholders") for r in _listed(data, "placeholders", where)
    ]
    bounds = [_keyed(r, _BOUND_KEYS, where, "simulation.bounds") for r in _listed(data, "bounds", where)]
    compiled = [
        _keyed(r, _COMPILED_KEYS, where, "simulation.compiled") for r in _listed(data, "compiled", where)
    ]
    oom = data.get("out_of_memory")
    skipped = data.get("skipped_saves", 0)
    if not isinstance(skipped, int) or isinstance(skipped, bool):
        raise BadInput(f"{where}: 'simulation.skipped_saves' is not a count")
    return SimulationInfo(
        gpu=gpu,
        placeholders=tuple(reads),
        bounds=tuple(bounds),
        skipped_saves=skipped,
        compiled=tuple(compiled),
        out_of_memory=None if oom is None else _keyed(oom, _OOM_KEYS, where, "simulation.out_of_memory"),
    )


def _levers(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    """A ``meta.json``'s ``levers``: a list of lever reports, each checked field by field
    against ``levers.LeverReport`` (keys it does not declare are dropped)."""
    if not isinstance(value, list):
        raise BadInput(f"{where}: 'levers' is not a list")
    return tuple(
        inputs.typed_fields(LeverReport, _mapping(item, where, "levers"), f"{where}: levers")
        for item in value
    )


def _stopped(value: Any, where: str) -> StopInfo:
    """A ``meta.json``'s ``stopped``, checked field by field."""
    return StopInfo(**inputs.typed_fields(StopInfo, _mapping(value, where, "stopped"), where))


def _mapping(value: Any, where: str, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadInput(f"{where}: {name!r} is not a record")
    return value


def _listed(data: dict[str, Any], name: str, where: str) -> list[Any]:
    value = data.get(name, [])
    if not isinstance(value, list):
        raise BadInput(f"{where}: 'simulation.{name}' is not a list")
    return value


def _keyed(value: Any, keys: dict[str, type], where: str, name: str) -> dict[str, Any]:
    """``value`` when it is a record holding ``keys`` of their types (ints not bools)."""
    record = _mapping(value, where, name)
    for key, kind in keys.items():
        item = record.get(key)
        if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
            raise BadInput(f"{where}: {name!r} lacks {key!r} as {kind.__name__}")
    return record


def _typed_rows(
    path: Path,
    columns: Sequence[str],
    notes: list[str] | None,
    optional: Sequence[str],
    record: type,
) -> Iterator[dict[str, Any]]:
    """Typed rows with ``columns`` (required, but for ``_OPTIONAL`` ones older files lack)
    and those of ``optional`` the file has. ``BadInput`` naming the file and the line of
    a row with a value that does not parse or a needed value missing (``_needed``)."""
    needed = _needed(record)
    with open_csv(path) as handle:
        complete = CompleteRows(handle, path)
        reader = LinedRows(complete)
        header = reader.fieldnames
        missing = [c for c in columns if c not in header and c not in _OPTIONAL]
        if missing:
            raise ValueError(f"{path} lacks the columns {', '.join(missing)}")
        present = [c for c in (*columns, *optional) if c in header]
        for row in reader:
            try:
                typed = {name: _value(name, row[name], needed) for name in present}
            except (TypeError, ValueError, KeyError) as exc:
                raise BadInput(f"{path}, line {reader.line}: {exc}") from None
            yield typed
    note = cut_note(path, complete)
    if note is not None and notes is not None:
        notes.append(note)


def _value(name: str, text: str | None, needed: frozenset[str]) -> Any:
    if text is None or text == "":
        if name in needed:
            raise ValueError(f"no value for {name!r}")
        return "" if name in _TEXT else None
    try:
        return _PARSE[name](text)
    except KeyError:
        raise ValueError(f"{name!r} is neither True nor False: {text[:40]!r}") from None
