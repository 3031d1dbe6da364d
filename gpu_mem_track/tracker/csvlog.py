"""The CSV report: one totals row per stamp, then one row per changed group.

All sizes are raw bytes. Columns (``COLUMNS``), empty where they do not apply:

- every row: ``seq``, ``time`` (seconds since the epoch), ``elapsed`` (seconds since the
  tracker started), ``file``, ``line``, ``function``, ``label``, ``row`` (``totals`` or
  ``change``), ``device``, ``rank`` (the rank of a distributed launch, empty outside one);
- change rows: ``kind``, ``shape`` (``4096x25088``; ``scalar`` for 0-d), ``dtype``,
  ``count_delta``, ``bytes_delta``, ``count`` and ``bytes`` (the group after the change),
  ``names`` (``;``-separated);
- totals rows: the ledger (see ``records.Ledger``): ``tensors``, ``allocated``,
  ``requested``, ``reserved``, ``peak_allocated``, ``driver``, ``driver_source``,
  ``context``, ``rss``, and the derived ``hidden``, ``cache``, ``framework``,
  ``framework_other``; ``views``; ``skipped`` (``reason:count:nominal_bytes``, ``;``-separated);
  the categories of ``tensors`` (``records.Categories``): ``cat_parameter``, ``cat_buffer``,
  ``cat_optimizer_state``, ``cat_gradient``, ``cat_input``, ``cat_activation``,
  ``cat_other``. The categories, ``hidden``, ``cache`` and ``framework`` add up to
  ``driver`` (or, as far as known, ``reserved``, ``allocated``; on CPU ``tensors``).

Reports written before the category or rank columns existed are read as well (categories
None, no rank).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..categories import CATEGORIES
from ..csvrows import CompleteRows, LinedRows, cell_text, cut_note, open_csv
from ..errors import BadInput
from ..inputs import parse_float, parse_int
from ..outputs import open_append
from ..units import shape_text
from .records import Categories, GroupChange, Ledger, Skipped, Stamp

__all__ = [
    "CATEGORY_COLUMNS",
    "COLUMNS",
    "REQUIRED_COLUMNS",
    "append_stamp",
    "read_frame",
    "iter_stamps",
    "read_stamps",
    "stamp_rows",
    "stamps_from_rows",
    "write_header",
]

_WHERE = ("seq", "time", "elapsed", "file", "line", "function", "label", "row", "device", "rank")
_CHANGE = ("kind", "shape", "dtype", "count_delta", "bytes_delta", "count", "bytes", "names")
#: The ledger's own figures, in ``records.Ledger`` field order (its device is a where column).
_LEDGER = tuple(f.name for f in fields(Ledger) if f.name not in ("device", "categories"))
_DERIVED = ("hidden", "cache", "framework", "framework_other")
#: Totals-row columns of the categories; optional when reading (older reports lack them).
CATEGORY_COLUMNS = tuple(f"cat_{name}" for name in CATEGORIES)
_TOTALS = _LEDGER + _DERIVED + ("views", "skipped") + CATEGORY_COLUMNS
COLUMNS = _WHERE + _CHANGE + _TOTALS
#: The columns every report has (the categories and the rank came later: older reports
#: lack them).
REQUIRED_COLUMNS = tuple(column for column in COLUMNS if column not in (*CATEGORY_COLUMNS, "rank"))


def stamp_rows(stamp: Stamp, rank: int | None = None) -> list[dict[str, Any]]:
    """The CSV rows of one stamp: its totals row, then its change rows (``rank``: of the
    distributed launch, None outside one)."""
    where = {
        "seq": stamp.seq,
        "time": repr(float(stamp.time)),
        "elapsed": repr(float(stamp.elapsed)),
        "file": stamp.file,
        "line": stamp.line,
        "function": stamp.function,
        "label": cell_text(stamp.label),
        "device": stamp.ledger.device,
        "rank": rank,
    }
    ledger = stamp.ledger
    totals = {name: getattr(ledger, name) for name in _LEDGER + _DERIVED}
    totals["views"] = stamp.views
    totals["skipped"] = ";".join(f"{s.reason}:{s.count}:{s.nominal_bytes}" for s in stamp.skipped)
    if ledger.categories is not None:
        for name, column in zip(CATEGORIES, CATEGORY_COLUMNS):
            totals[column] = getattr(ledger.categories, name)
    rows = [{**where, "row": "totals", **totals}]
    for change in stamp.changes:
        rows.append(
            {
                **where,
                "row": "change",
                "kind": change.kind,
                "shape": shape_text(change.shape),
                "dtype": change.dtype,
                "count_delta": change.count_delta,
                "bytes_delta": change.bytes_delta,
                "count": change.count,
                "bytes": change.nbytes,
                "names": cell_text(";".join(change.names)),
            }
        )
    return [{column: _cell(row.get(column)) for column in COLUMNS} for row in rows]


def write_header(path: Path) -> None:
    """Write the header row into ``path``, an existing empty file (a report with no stamps
    yet, see ``outputs.ReportFiles``); a symbolic link is refused (``OSError``)."""
    with open_append(path, newline="") as handle:
        if handle.tell() == 0:
            csv.DictWriter(handle, fieldnames=COLUMNS).writeheader()


def append_stamp(path: str | Path, stamp: Stamp, rank: int | None = None) -> None:
    """Append a stamp's rows to ``path``, an existing file (the header first if it is
    empty), then flush and close, so a crash after this call loses nothing of it. A
    symbolic link is refused (``OSError``)."""
    with open_append(path, newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        if handle.tell() == 0:
            writer.writeheader()
        writer.writerows(stamp_rows(stamp, rank))


def read_stamps(path: Path, notes: list[str] | None = None) -> list[Stamp]:
    """Stamps back from a CSV written by ``append_stamp`` (inverse of ``stamp_rows``);
    see ``iter_stamps``."""
    return list(iter_stamps(path, notes))


def iter_stamps(path: Path, notes: list[str] | None = None) -> Iterator[Stamp]:
    """The stamps of a CSV written by ``append_stamp``, one at a time: the one guarded
    reader of this format (``csvrows.open_csv``: a regular file, UTF-8 with or without a
    byte-order mark; ASCII integers, finite times).

    A last row cut mid-write (a killed process) is left out; ``notes``, when given,
    receives one line saying so. Raises ``errors.BadInput`` (a ``ValueError``; one line
    naming the file, and for a bad row the line where that row starts) when it is not
    such a report.
    """
    return _stamps(path, notes)


def _stamps(path: Path, notes: list[str] | None, copy: list[str] | None = None) -> Iterator[Stamp]:
    """``iter_stamps``; each complete line read is appended to ``copy`` when given."""
    with open_csv(path) as handle:
        rows = CompleteRows(handle, path)
        reader = LinedRows(rows if copy is None else _copied(rows, copy))
        header = reader.fieldnames
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise BadInput(f"{path} is not a gpu_mem_track CSV report ({_lacks(header, missing)})")
        try:
            yield from stamps_from_rows(reader)
        except BadInput:
            raise
        except (TypeError, AttributeError, KeyError, ValueError, csv.Error) as exc:
            raise BadInput(f"{path}, line {reader.line}: not a valid report row ({exc})") from None
    note = cut_note(path, rows)
    if note is not None and notes is not None:
        notes.append(note)


def _copied(lines: Iterable[str], copy: list[str]) -> Iterator[str]:
    for line in lines:
        copy.append(line)
        yield line


def _lacks(fields: list[str], missing: list[str]) -> str:
    if not fields:
        return "it is empty"
    return f"no {', '.join(missing[:3])} column"


_TEXT_COLUMNS = (
    "file",
    "function",
    "label",
    "row",
    "device",
    "kind",
    "shape",
    "dtype",
    "names",
    "driver_source",
    "skipped",
)


def read_frame(source: Path | list[dict[str, Any]], notes: list[str] | None = None) -> Any:
    """The report as a pandas DataFrame with ``COLUMNS``: from a CSV path, or from rows
    as ``stamp_rows`` makes them. Text columns stay text (``""`` where empty; a label
    ``"007"`` stays ``"007"``); number columns are numbers (NaN where not applicable).

    A CSV path is read by the guarded reader (``iter_stamps``): a damaged or hand-edited
    file raises ``errors.BadInput`` naming the file and the line, and a number column
    holding an integer beyond 64 bits names the column. A last row cut mid-write is left
    out (``notes``, when given, receives one line)."""
    import io

    import pandas as pd

    buffer = io.StringIO()
    if isinstance(source, Path):
        lines: list[str] = []
        for _ in _stamps(source, notes, lines):  # checks every row, as read_stamps does
            pass
        buffer.writelines(lines)
        del lines
    else:
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(source)
    buffer.seek(0)
    frame = pd.read_csv(
        buffer,
        dtype={c: str for c in _TEXT_COLUMNS},
        keep_default_na=False,
        na_values={c: [""] for c in COLUMNS if c not in _TEXT_COLUMNS},
    )
    if isinstance(source, Path) and len(frame):  # no rows: every column is text (as before)
        _numeric(frame, source)
    return frame.reindex(columns=list(COLUMNS))  # an older report: its missing columns are NaN


def _numeric(frame: Any, path: Path) -> None:
    """Refuse (``BadInput``) a number column pandas could not hold as int64 or float64."""
    for column in frame.columns.intersection(COLUMNS):
        if column not in _TEXT_COLUMNS and frame[column].dtype.kind not in "if":
            raise BadInput(f"{path}: column {column!r} holds integers beyond 64 bits")


def stamps_from_rows(rows: Iterable[dict[str, str]]) -> Iterator[Stamp]:
    """Rebuild stamps from CSV rows: a totals row opens a stamp, change rows follow it.
    Each row is parsed when it is read (a bad one raises ``ValueError`` before the next
    is read, so a reader can name its line)."""
    current: Stamp | None = None
    changes: list[GroupChange] = []
    for row in rows:
        if row["row"] == "totals":
            if current is not None:
                yield replace(current, changes=tuple(changes))
            current, changes = _stamp(row), []
        elif row["row"] == "change" and current is not None:
            changes.append(_change(row))
        else:
            raise ValueError(f"row type {row['row']!r} where 'totals' or 'change' belongs")
    if current is not None:
        yield replace(current, changes=tuple(changes))


def _stamp(row: dict[str, str]) -> Stamp:
    """The stamp of a totals row, without its changes."""
    ledger = Ledger(
        device=row["device"],
        tensors=parse_int(row["tensors"]),
        driver_source=row["driver_source"] or None,
        **{name: _int(row[name]) for name in _LEDGER if name not in ("tensors", "driver_source")},
        categories=_categories(row),
    )
    skipped = tuple(
        Skipped(reason, parse_int(count), parse_int(nominal))
        for reason, count, nominal in (item.rsplit(":", 2) for item in row["skipped"].split(";") if item)
    )
    return Stamp(
        seq=parse_int(row["seq"]),
        time=parse_float(row["time"]),
        elapsed=parse_float(row["elapsed"]),
        file=row["file"],
        line=parse_int(row["line"]),
        function=row["function"],
        label=row["label"],
        ledger=ledger,
        skipped=skipped,
        views=_int(row["views"]) or 0,
    )


def _change(row: dict[str, str]) -> GroupChange:
    return GroupChange(
        kind=row["kind"],
        shape=_shape_from(row["shape"]),
        dtype=row["dtype"],
        device=row["device"],
        count_delta=parse_int(row["count_delta"]),
        bytes_delta=parse_int(row["bytes_delta"]),
        count=parse_int(row["count"]),
        nbytes=parse_int(row["bytes"]),
        names=tuple(row["names"].split(";")) if row["names"] else (),
    )


def _categories(row: dict[str, str]) -> Categories | None:
    """The categories of a totals row; None when the report predates them or left them empty."""
    cells = [row.get(column) or "" for column in CATEGORY_COLUMNS]
    if not all(cells):
        return None
    return Categories(**{name: parse_int(cell) for name, cell in zip(CATEGORIES, cells)})


def _shape_from(text: str) -> tuple[int, ...]:
    return () if text == "scalar" else tuple(parse_int(n) for n in text.split("x"))


def _int(text: str) -> int | None:
    return parse_int(text) if text not in ("", None) else None


def _cell(value: Any) -> Any:
    return "" if value is None else value
