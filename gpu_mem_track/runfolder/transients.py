"""Where a timeline draws each line's transient peak: where it happened, not at the end
of every enclosing line.

A ``timeline.csv`` row is written when a line ends: the memory then, and the highest
memory seen while it ran (``peak``). A line that calls traced code (``main()`` at module
level) ends after all of its callee's lines; its peak is the highest of theirs, which
their own rows already drew. Drawn again at the caller's end time it would be a false
spike to the run's peak at the very end. So a row's peak is drawn (just before its end
value) only when nothing drawn since the line started reached it.

When the line started is not recorded; it is inferred from the order of the rows: the
frames of the rows (file, function) form a call stack; a line of a frame already on the
stack started when that frame's previous row ended (the rows of deeper frames in between
ran inside it); the script's ``<module>`` frame (the ``start`` row's) is at the bottom. A
frame not on the stack may be a callee (its first line started when the previous row
ended) or a caller whose first line called the frames above (its line started before
their rows): its window is taken as the outermost frame's current line, which holds
both, so an equal peak drawn earlier in that line is not repeated. The memory at a
line's start counts as drawn. Recursion (one frame key on the stack twice) makes a
window shorter, so a peak may be drawn twice, never lost.

When a line ran traced callees but none of them reached its peak (their peaks are lower
bounds, or the peak came from untraced code between them), the peak is drawn at the
callee row with the highest value: in that window, the best guess of where it happened.
That needs a look back, so it is found in a first pass (``raised_peaks``) and applied in a
second (``PeakPlacer(raised)``). All values are bytes of the run's memory source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .records import TimelineRow

__all__ = ["PeakPlacer", "raised_peaks"]


@dataclass
class _Frame:
    """One open frame: the highest value drawn since its current line started, and the
    index of the deeper line row holding the highest value in that window."""

    key: tuple[str, str]
    high: int
    best: int | None = None
    best_value: int = -1


class PeakPlacer:
    """Decides, row by row in file order, the transient peak to draw before each row's
    value. ``raised``: row index -> a peak to draw there (``raised_peaks``'s result);
    ``found`` collects the peaks this pass moved to an earlier row."""

    def __init__(self, raised: Mapping[int, int] | None = None) -> None:
        self._raised = dict(raised or {})
        self._stack: list[_Frame] = []
        self._last = 0
        self.found: dict[int, int] = {}

    def place(self, index: int, row: TimelineRow) -> int | None:
        """The transient peak (bytes) to draw just before row ``index``'s memory, or None.
        Rows without a memory figure draw nothing and change nothing."""
        if row.memory is None:
            return None
        transient = self._raised.get(index)
        if row.event == "start" and not self._stack:
            self._stack.append(_Frame((row.file, row.function or "<module>"), row.memory))
        if row.event == "line":
            frame = self._enter((row.file, row.function))
            peak = row.peak
            if peak is not None and peak > row.memory and peak > frame.high:
                if frame.best is None:
                    transient = max(transient or 0, peak)
                else:  # traced callees ran: the peak happened in one of them
                    self.found[frame.best] = max(self.found.get(frame.best, 0), peak)
                    for open_frame in self._stack:
                        open_frame.high = max(open_frame.high, peak)
        drawn = transient if transient is not None and transient > row.memory else None
        self._seen(index, row, max(drawn or 0, row.memory))
        if row.event == "line":  # the frame's next line starts here
            top = self._stack[-1]
            top.high, top.best, top.best_value = row.memory, None, -1
        self._last = row.memory
        return drawn

    def _enter(self, key: tuple[str, str]) -> _Frame:
        for depth in range(len(self._stack) - 1, -1, -1):
            if self._stack[depth].key == key:
                del self._stack[depth + 1 :]  # callees that returned
                return self._stack[depth]
        # A callee's first line or a caller's (see the module docstring).
        outer = self._stack[0] if self._stack else None
        frame = _Frame(key, self._last)
        if outer is not None:
            frame.high = max(outer.high, self._last)
            frame.best, frame.best_value = outer.best, outer.best_value
        self._stack.append(frame)
        return frame

    def _seen(self, index: int, row: TimelineRow, value: int) -> None:
        """Row ``index`` drew up to ``value``: inside every open frame's current line."""
        for frame in self._stack:
            frame.high = max(frame.high, value)
            if row.event == "line" and (frame.best is None or value > frame.best_value):
                frame.best, frame.best_value = index, value


def raised_peaks(rows: Iterable[TimelineRow]) -> dict[int, int]:
    """The first pass: row index -> the peak of an enclosing line to draw at that row
    (see the module docstring)."""
    placer = PeakPlacer()
    for index, row in enumerate(rows):
        placer.place(index, row)
    return placer.found
