"""Reading CSV reports that a stopped process may have cut mid-row.

Every report is appended to while a program runs; a process killed mid-write (SIGKILL,
the OOM killer, a full disk) leaves a last row without its line end, or with a quoted
cell never closed. ``CompleteRows`` hands a CSV reader only the complete rows and keeps
the cut one aside, so a reader returns every complete row and can say what it left out
(``cut_note``) instead of refusing the whole file or reading half a number.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["CompleteRows", "cut_note"]

_ENDS = ("\n", "\r")


class CompleteRows:
    """The lines of a CSV text, each complete row whole, the cut last row held back.

    ``lines``: the file's lines with their line ends (a file opened with ``newline=""``,
    as the ``csv`` module wants). A row is complete when it ends with a line end outside
    quotes (``csv`` doubles a quote inside a quoted cell, so an odd count of ``"`` means
    a quoted cell is still open: its newline belongs to the cell). After iteration,
    ``cut`` is the text of the incomplete last row (``""``: none) and ``cut_line`` its
    1-based line number in the file (0: none).
    """

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = lines
        self.cut = ""
        self.cut_line = 0

    def __iter__(self) -> Iterator[str]:
        pending: list[str] = []
        quotes = 0
        number = 0
        for number, line in enumerate(self._lines, start=1):  # noqa: B007 (read after the loop)
            pending.append(line)
            quotes += line.count('"')
            if quotes % 2 == 0 and line.endswith(_ENDS):
                yield from pending
                pending.clear()
                quotes = 0
        self.cut = "".join(pending)
        self.cut_line = number - len(pending) + 1 if pending else 0


def cut_note(path: str | Path, rows: CompleteRows) -> str | None:
    """One line saying that the last row of ``path`` was cut mid-write and left out, or
    None when every row was complete (call after ``rows`` was read to its end)."""
    if not rows.cut:
        return None
    return (
        f"{path}, line {rows.cut_line}: the last row is incomplete (the writing process "
        "stopped mid-row); read the complete rows before it"
    )
