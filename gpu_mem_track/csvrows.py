"""Reading the CSV reports we write, guarded, and cut short by a stopped process.

Every report is appended to while a program runs; a process killed mid-write (SIGKILL,
the OOM killer, a full disk) leaves a last row without its line end, or with a quoted
cell never closed. ``CompleteRows`` hands a CSV reader only the complete rows and keeps
the cut one aside, so a reader returns every complete row and can say what it left out
(``cut_note``) instead of refusing the whole file or reading half a number.

It follows the ``csv`` module's own quoting rules (a quote opens a quoted cell only at
the start of a cell; ``""`` inside one is a quote), so a stray quote inside a cell reads
as ``csv`` reads it. A complete row with more cells than the header, or a quote at
the start of a cell that never closes while complete rows follow it, is named by its
line (``errors.BadInput``) instead of swallowing the rows after it. Bounded: a cell
holds at most ``FIELD_LIMIT`` characters (writers cut longer text with ``cell_text``,
so what we write we read back) and a row at most ``ROW_LIMIT``.

``open_csv`` opens a report guarded: a regular file only (never a FIFO or a device),
UTF-8 with or without a byte-order mark. ``LinedRows`` reads the rows as
``csv.DictReader`` does, each with the line where it starts in the file (a quoted cell
may span lines), so a bad row is named by its own first line.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from .errors import BadInput
from .inputs import open_regular

__all__ = ["FIELD_LIMIT", "ROW_LIMIT", "CompleteRows", "LinedRows", "cell_text", "cut_note", "open_csv"]

#: Most characters in one cell, written (``cell_text``) and read (``csv.field_size_limit``
#: is raised to it, never lowered); a source line or a ``track()`` label longer than
#: this is cut on writing.
FIELD_LIMIT = 2**20
#: Most characters in one row (all its cells, its quotes and line ends).
ROW_LIMIT = 8 * FIELD_LIMIT
#: What ``cell_text`` puts in place of the text it cut.
CUT_MARK = " [...]"

_ENDS = ("\n", "\r")


def open_csv(path: str | Path, what: str = "a gpu_mem_track report") -> TextIO:
    """``path`` opened as CSV text: only a regular file (``BadInput`` otherwise, before any
    read), UTF-8 with a byte-order mark skipped, ``newline=""`` as ``csv`` wants; the
    ``csv`` field limit raised to ``FIELD_LIMIT``."""
    if csv.field_size_limit() < FIELD_LIMIT + 2:
        csv.field_size_limit(FIELD_LIMIT + 2)
    handle = open_regular(path, what)
    return io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")


def cell_text(text: str) -> str:
    """``text`` as a CSV cell we can read back: at most ``FIELD_LIMIT`` characters (a
    longer one cut, ending with ``CUT_MARK``)."""
    if len(text) <= FIELD_LIMIT:
        return text
    return text[: FIELD_LIMIT - len(CUT_MARK)] + CUT_MARK


class CompleteRows:
    """The lines of a CSV text, each complete row whole, the cut last row held back.

    ``lines``: the file's lines with their line ends (a file opened with ``newline=""``,
    as the ``csv`` module wants). A row is complete when it ends with a line end outside
    a quoted cell. The first complete row is the header; no later one may have more
    cells (``BadInput`` naming ``source`` and the line otherwise: a stray quote merged
    rows). Fewer cells read as empty ones (``csv.DictReader``): the typed readers refuse
    a row lacking a required value. After iteration,
    ``cut`` is the text of the incomplete last row (``""``: none) and ``cut_line`` its
    1-based line number in the file (0: none).
    """

    def __init__(self, lines: Iterable[str], source: str | Path = "CSV") -> None:
        self._lines = lines
        self.source = source
        self.cut = ""
        self.cut_line = 0
        self.columns = 0

    def __iter__(self) -> Iterator[str]:
        pending: list[str] = []
        size = 0
        scan = _Scan()
        number = 0
        for number, line in enumerate(self._lines, start=1):  # noqa: B007 (read after the loop)
            if not pending and self.columns and '"' not in line and line.endswith(_ENDS):
                # The common row: one line, no quote, within the header's width.
                if line.count(",") >= self.columns:
                    self._check(line.count(",") + 1, number)
                yield line
                continue
            pending.append(line)
            size += len(line)
            scan.feed(line)
            if not scan.quoted and line.endswith(_ENDS):
                self._check(scan.cells, number - len(pending) + 1)
                yield from pending
                pending.clear()
                size = 0
                scan = _Scan()
            elif size > ROW_LIMIT:
                self._fail(number - len(pending) + 1, f"a row longer than {ROW_LIMIT:,} characters")
        if len(pending) > 1 and scan.quoted and self._rows_inside(pending[1:]):
            self._fail(
                number - len(pending) + 1,
                "a quoted cell opens here and never closes (a stray quote?), "
                f"swallowing the {len(pending) - 1} lines after it",
            )
        self.cut = "".join(pending)
        self.cut_line = number - len(pending) + 1 if pending else 0

    def _check(self, cells: int, line: int) -> None:
        if not self.columns:
            self.columns = cells
        elif cells > self.columns:
            self._fail(line, f"{cells} cells where the header has {self.columns}")

    def _rows_inside(self, lines: list[str]) -> bool:
        """Whether some of ``lines``, read from a fresh start, is a complete row of the
        header's width (then the quote before them was stray, not a cut row)."""
        for line in lines:
            scan = _Scan()
            scan.feed(line)
            if not scan.quoted and line.endswith(_ENDS) and 1 < scan.cells <= self.columns:
                return True
        return False

    def _fail(self, line: int, problem: str) -> None:
        raise BadInput(f"{self.source}, line {line}: not a valid report row ({problem})")


class LinedRows:
    """The rows of CSV ``lines`` as dicts keyed by the header row (``fieldnames``), as
    ``csv.DictReader`` gives them (blank lines skipped; missing cells ``None``; extra
    cells a list under ``None``), keeping ``line``: the 1-based line of the file where
    the row last given (or, while one is read, the row being read) starts.

    ``csv.reader``'s ``line_num`` is the line the reader stopped at: past the start of a
    row whose quoted cell spans lines, and past the row in hand once a caller has read
    further. ``line`` is set before each row is read, so neither moves it.
    """

    def __init__(self, lines: Iterable[str]) -> None:
        self._reader = csv.reader(lines)
        self.line = 1
        self.fieldnames: list[str] = next(self._reader, [])

    def __iter__(self) -> Iterator[dict[Any, Any]]:
        names, width = self.fieldnames, len(self.fieldnames)
        while True:
            self.line = self._reader.line_num + 1
            cells = next(self._reader, None)
            if cells is None:
                return
            if not cells:
                continue
            row: dict[Any, Any] = dict(zip(names, cells))
            if len(cells) > width:
                row[None] = cells[width:]
            elif len(cells) < width:
                row.update(dict.fromkeys(names[len(cells) :]))
            yield row


class _Scan:
    """The ``csv`` module's reading state over a row's lines: inside a quoted cell or
    not, at the start of a cell or not, and the cells counted so far."""

    __slots__ = ("at_start", "cells", "quoted")

    def __init__(self) -> None:
        self.quoted = False
        self.at_start = True
        self.cells = 1

    def feed(self, line: str) -> None:
        if not self.quoted and '"' not in line:  # the common case, at C speed
            self.cells += line.count(",")
            self.at_start = False  # the row ends here (or the file does, cut)
            return
        at, end = 0, len(line)
        while at < end:
            if self.quoted:
                close = line.find('"', at)
                if close < 0:
                    return
                if line.startswith('"', close + 1):  # ``""``: a quote inside the cell
                    at = close + 2
                    continue
                self.quoted, self.at_start, at = False, False, close + 1
            elif self.at_start and line[at] == '"':
                self.quoted, at = True, at + 1
            else:
                comma = line.find(",", at)
                if comma < 0:
                    self.at_start = False
                    return
                self.cells += 1
                self.at_start, at = True, comma + 1


def cut_note(path: str | Path, rows: CompleteRows) -> str | None:
    """One line saying that the last row of ``path`` was cut mid-write and left out, or
    None when every row was complete (call after ``rows`` was read to its end)."""
    if not rows.cut:
        return None
    return (
        f"{path}, line {rows.cut_line}: the last row is incomplete (the writing process "
        "stopped mid-row); read the complete rows before it"
    )
