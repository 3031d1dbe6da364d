"""The line profiler: turns line events into per-line aggregates and a streamed timeline.

``LineProfiler`` is the ``tracer.LineSink`` of a run. At every event it takes one
reading from its sampler and closes the line that was running in the innermost traced
frame: memory after it, increment, peak (from the sampler's high-water mark, never reset;
see ``samplers``), wall time. Aggregates live in one small list per source line; each
execution goes to the timeline writer at once, so memory stays bounded however long the
run. A line runs until the next statement starts in the same frame or the frame is left,
so a line's figures include the functions it calls; a statement spread over several lines
is one execution of its first line (``statements``).

The run's peak is the highest reading of the run, line or not (the ``start`` and ``end``
rows of the timeline included). The line it is attributed to (``peak_at``) is one that
allocated it: the first line execution to end that came within the sampler's tolerance
(``peak_tolerance``, 1% of the peak by default) of the run's peak with a rise (its peak
above its own start) larger than that tolerance. A line that merely touched one more page
at the high-water mark does not qualify, and a callee's line that allocated ends before
the call that ran it, so the innermost traced line is named. When no execution qualifies,
the first to reach the peak is named (or none, when the peak was read outside any line).

Where the native line sink is built (``native.linesink``), ``line``, ``enter`` and
``leave`` are its C++ versions (``line_sink.cpp``): the same work on this object's own
lists and attributes, which hands every rare case (a code object's first line, a line's
first execution, a run's new peak, the extras, a snapshot window, a census) back to the
methods below, so records and timeline are the same either way (``native`` says which).
"""

from __future__ import annotations

import linecache
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

from ..native import linesink
from ..runfolder.files import TimelineWriter, csv_line
from ..runfolder.records import LineRecord, TimelineRow
from .samplers import Sampler
from .statements import statement_starts

__all__ = ["LineProfiler", "function_name"]

#: Index of each aggregate in the per-line list: hits, memory after the last execution,
#: total increment, max peak, whether that peak is exact, seconds, max rise, max reserved
#: peak (CUDA); then the line's timeline cells ``line,file,function`` (``_WHERE``).
_HITS, _MEMORY, _INCREMENT, _PEAK, _EXACT, _SECONDS, _RISE, _RESERVED, _WHERE = range(9)

# A frame on the profiler's stack: [code, running statement's first line (or None), memory,
# high-water mark, time, the sampler's event count] as read when that statement started,
# the line of the last event in the frame (index ``_LAST``), and (CUDA) the allocator's
# reserved bytes (None until read) and reserved peak read when the statement started
# (indexes ``_RES``, ``_RES_PEAK``).
_Frame = list
_LAST, _RES, _RES_PEAK = 6, 7, 8


class LineProfiler:
    """Aggregates line events; see the module docstring.

    Args:
        sampler: the memory readings (``samplers``).
        timeline: the ``files.TimelineWriter`` that streams each row, or None to keep no
            timeline.
        on_increment: called as ``on_increment(code, lineno, increment)`` when one execution
            of a line grew memory by at least ``threshold`` bytes (the automatic census).
        threshold: see ``on_increment``; None never calls it.
        extras_every: seconds between readings of the sampler's slower extras (driver, RSS)
            for the timeline; rows in between leave them empty.
        clock: monotonic seconds.
        windows: told ``windows.add(code, lineno, start, end, before, after)`` after each
            execution during which the sampler's ``events`` count moved from ``start`` to
            ``end`` (the allocator's allocations and frees; ``run --snapshot``), with the
            memory read when it started and ended; or None.
        rank: the rank of the distributed launch, written in every row and record (None
            outside one).
        line_sink: the native ``line_sink`` module to run the common path with, None for
            Python only; default: ``native.linesink.for_run()``'s (built, not turned off;
            when not built yet, it starts its build in the background for later runs).
    """

    def __init__(
        self,
        sampler: Sampler,
        timeline: TimelineWriter | None = None,
        on_increment: Callable[[CodeType, int, int], None] | None = None,
        threshold: int | None = None,
        extras_every: float = 0.5,
        clock: Callable[[], float] = time.perf_counter,
        windows: Any = None,
        rank: int | None = None,
        line_sink: Any = "auto",
    ) -> None:
        self.rank = rank
        self._rank_cell = "" if rank is None else str(rank)
        self._sampler = sampler
        self._sample = sampler.sample
        self._timeline = timeline
        self._write_text = timeline.write_text if timeline is not None else None
        self._on_cuda = sampler.source == "cuda allocator"
        # the reserved bytes' peak per line, where the sampler reads it (the CUDA allocator)
        self._reserved = self._on_cuda and hasattr(sampler, "reserved_peak")
        # Keyed by id(code), which hashes far faster than the code object (hashed anew from
        # its name, bytecode and constants at every lookup); ``_codes`` keeps each alive.
        self._codes: dict[int, CodeType] = {}
        self._where: dict[int, str] = {}
        self._on_increment = on_increment
        self._threshold = threshold
        self._extras_every = extras_every
        self._clock = clock
        self._windows = windows
        self._stack: list[_Frame] = []
        self._stats: dict[tuple[int, int], list[Any]] = {}
        self._starts: dict[int, dict[int, int]] = {}
        self._file_starts: dict[str, dict[int, int]] = {}  # parsed once per file
        self._seq = 0
        self._start = clock()
        self._extras_at = -extras_every
        self._tolerance = getattr(sampler, "peak_tolerance", _one_percent)
        #: the highest reading of the run so far (bytes)
        self.peak = 0
        self._floor = 0  # executions peaking at or above this are near the run's peak
        self._significant = 0  # a rise above this allocated, not touched a page
        # (peak, rise, where) of executions near the peak with a significant rise, in the
        # order they ended, each peaking higher than the one before (a later one at or
        # below an earlier one's peak could never be named)
        self._candidates: list[tuple[int, int, tuple[str, int] | None]] = []
        self._peak_where: tuple[str, int] | None = None  # the first to reach the peak
        self.first_reading = self._sample()[0]
        if line_sink == "auto":
            self._line_sink, note = linesink.for_run()
        else:
            self._line_sink, note = line_sink, "given" if line_sink is not None else "not given"
        #: whether ``line``/``enter``/``leave`` run natively (see the module docstring)
        self.native = False
        #: why the native line sink is used or not (``native.linesink.status()``'s line)
        self.native_note = note
        if self._line_sink is not None:
            core = self._line_sink.Core(self, self._python_line, self._native_reads())
            self.line, self.enter, self.leave = core.line, core.enter, core.leave  # type: ignore[method-assign]
            self.native = True

    def _python_line(self, code: CodeType, lineno: int) -> None:
        LineProfiler.line(self, code, lineno)

    def _native_reads(self) -> bool:
        """Whether the native sink may call the sampler's native CUDA read (its ``_read``)
        itself rather than ``sample()``."""
        return self._on_cuda and hasattr(self._sampler, "_read")

    def monitoring_callbacks(
        self, wanted: dict[int, CodeType], decide: Callable[[CodeType, int], Any], main: int
    ) -> Any:
        """``(start, throw, leave, line)``: native ``sys.monitoring`` callbacks for the
        engine (``tracer.MonitoringEngine``): ``wanted`` its wanted code objects by id,
        ``decide`` its Python start callback for code not in it, ``main`` the traced
        thread's ident. None without the native sink."""
        if self._line_sink is None:
            return None
        core = self._line_sink.Core(self, self._python_line, self._native_reads(), wanted, decide, main)
        return core.monitor_start, core.monitor_throw, core.monitor_leave, core.monitor_line

    # -- tracer.LineSink ----------------------------------------------------------------------

    def enter(self, code: CodeType) -> None:
        # No reading: the frame's first line event reads the start of its first line.
        self._stack.append([code, None, 0, 0, 0.0, 0, 0, None, 0])

    def line(self, code: CodeType, lineno: int) -> None:
        starts = self._starts.get(id(code))
        if starts is None:
            starts = self._first_seen(code)
        first = starts.get(lineno, lineno) if starts else lineno
        stack = self._stack
        frame = stack[-1] if stack and stack[-1][0] is code else None
        # Inside the statement already running: the same execution goes on. Its first line
        # again right after itself is a new execution (a loop on one line).
        if frame is not None and frame[1] == first and (lineno != first or frame[_LAST] != first):
            frame[_LAST] = lineno
            return
        current, high = self._sample()
        now = self._clock()
        if frame is None:  # an event the engine did not send
            frame = [code, None, current, high, now, 0, lineno, None, 0]
            stack.append(frame)
        if frame[1] is not None and self._close(frame, current, high, now):
            # a census ran after the line: start the next one after it, not before
            current, high = self._sample()
            now = self._clock()
        frame[1], frame[2], frame[3], frame[4], frame[_LAST] = first, current, high, now, lineno
        if self._reserved:
            frame[_RES], frame[_RES_PEAK] = self._sampler.reserved, self._sampler.reserved_peak
        if self._windows is not None:
            frame[5] = self._sampler.events

    def leave(self, code: CodeType) -> None:
        stack = self._stack
        if not stack or stack[-1][0] is not code:
            return
        frame = stack.pop()
        if frame[1] is not None:
            current, high = self._sample()
            self._close(frame, current, high, self._clock())

    # -- results ------------------------------------------------------------------------------

    def finish(self) -> None:
        """Close every line still running (the run ended or was interrupted)."""
        while self._stack:
            self.leave(self._stack[-1][0])

    def records(self) -> list[LineRecord]:
        """One record per source line that ran, with its source text."""
        out = []
        for (key, lineno), stats in self._stats.items():
            code = self._codes[key]
            out.append(
                LineRecord(
                    file=code.co_filename,
                    function=function_name(code),
                    line=lineno,
                    code=linecache.getline(code.co_filename, lineno).strip(),
                    hits=stats[_HITS],
                    memory=stats[_MEMORY],
                    increment=stats[_INCREMENT],
                    peak=stats[_PEAK],
                    peak_exact=stats[_EXACT],
                    seconds=stats[_SECONDS],
                    rise=stats[_RISE],
                    reserved_peak=stats[_RESERVED] if self._reserved else None,
                    rank=self.rank,
                )
            )
        return out

    @property
    def peak_at(self) -> tuple[str, int] | None:
        """``(file, line)`` of the line that raised memory to the run's peak (see the module
        docstring), or None when no line came near it (it was read outside any line)."""
        for peak, rise, where in self._candidates:
            if peak >= self._floor and rise > self._significant:
                return where
        return self._peak_where

    def high_marks(self) -> tuple[int, int | None, int, int]:
        """What only grows while memory keeps finding new highs: the run's peak (bytes),
        the sampler's reserved peak (bytes; None where it has none), the number of source
        lines that have run and the sum of their peaks. Two equal readings mean no line
        reached a new peak and no new line ran in between (``steady.LoopWatch``)."""
        peaks = sum(stats[_PEAK] for stats in self._stats.values())
        return self.peak, getattr(self._sampler, "reserved_peak", None), len(self._stats), peaks

    def elapsed(self) -> float:
        """Seconds since the profiler was created, by its clock."""
        return self._clock() - self._start

    # -- internals ----------------------------------------------------------------------------

    def _first_seen(self, code: CodeType) -> dict[int, int]:
        """Keep ``code`` alive (its id keys the tables) and return its file's statement
        starts (``statements``), parsed once per file."""
        self._codes[id(code)] = code
        starts = self._file_starts.get(code.co_filename)
        if starts is None:
            starts = self._file_starts[code.co_filename] = statement_starts(code.co_filename)
        self._starts[id(code)] = starts
        return starts

    def _close(self, frame: _Frame, current: int, high: int, now: float) -> bool:
        """Record the end of the frame's running line; True when ``on_increment`` ran."""
        code, lineno, before, high_before = frame[0], frame[1], frame[2], frame[3]
        increment = current - before
        # the peak: comparisons written out, as max() costs a call at every line
        if high > high_before:
            # the new mark, or a reading above it: a mark read a moment before ``current``
            # may lag it a little
            peak, exact = high if high >= before else before, True
            if current > peak:
                peak = current
        else:  # the mark did not move (or the program reset it): a lower bound
            peak, exact = before if before >= current else current, False
            if high < high_before and high > peak:
                peak = high
        rise = peak - before
        key = (id(code), lineno)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = [0, 0, 0, 0, False, 0.0, 0, 0, self._where_cells(code)]
        stats[_HITS] += 1
        stats[_MEMORY] = current
        stats[_INCREMENT] += increment
        if peak > stats[_PEAK] or (peak == stats[_PEAK] and exact):
            stats[_PEAK], stats[_EXACT] = peak, exact
        if rise > stats[_RISE]:
            stats[_RISE] = rise
        if self._reserved and frame[_RES] is not None:
            # as the allocated peak: the allocator's reserved peak when it rose while the
            # line ran, else the larger of the readings before and after
            reserved_peak = self._sampler.reserved_peak
            if reserved_peak <= frame[_RES_PEAK]:
                reserved_peak = frame[_RES]
                if self._sampler.reserved > reserved_peak:
                    reserved_peak = self._sampler.reserved
            if reserved_peak > stats[_RESERVED]:
                stats[_RESERVED] = reserved_peak
        stats[_SECONDS] += now - frame[4]
        if self._windows is not None and self._sampler.events != frame[5]:
            self._windows.add(code, lineno, frame[5], self._sampler.events, before, current)
        if peak > self.peak or (rise > self._significant and peak >= self._floor):
            self._offer(peak, rise, (code.co_filename, lineno))
        if self._write_text is not None:
            self._line_row(stats[_WHERE], lineno, current, increment, peak, now)
        if self._threshold is not None and increment >= self._threshold and self._on_increment:
            self._on_increment(code, lineno, increment)
            return True
        return False

    def _offer(self, peak: int, rise: int, where: tuple[str, int] | None) -> None:
        """An execution (``where``; None for an event row) that reached the run's peak or
        came near it with a significant rise; see the module docstring."""
        if peak > self.peak:
            self.peak, self._peak_where = peak, where
            self._significant = self._tolerance(peak)
            self._floor = peak - self._significant
            self._candidates = [c for c in self._candidates if c[0] >= self._floor]
        candidates = self._candidates
        if rise > self._significant and (not candidates or peak > candidates[-1][0]) and len(candidates) < 64:
            candidates.append((peak, rise, where))

    def _where_cells(self, code: CodeType) -> str:
        """The timeline cells ``line,file,function`` of ``code``'s rows."""
        where = self._where.get(id(code))
        if where is None:
            where = self._where[id(code)] = csv_line(["line", code.co_filename, function_name(code)])[:-1]
        return where

    def _line_row(self, where: str, lineno: int, current: int, increment: int, peak: int, now: float) -> None:
        """The timeline row of one line execution (``where``: see ``_where_cells``),
        formatted here: the hot path. Its cells follow ``files.TIMELINE_COLUMNS``
        (``records.TimelineRow``) by hand, for speed; tests/test_schemas.py holds the two
        together."""
        elapsed = now - self._start
        driver = rss = ""
        if elapsed - self._extras_at >= self._extras_every:
            self._extras_at = elapsed
            read_driver, read_rss = self._sampler.extras()
            driver = "" if read_driver is None else read_driver
            rss = "" if read_rss is None else read_rss
        memory = str(current)
        allocated = memory if self._on_cuda else ""  # the same figure on CUDA: formatted once
        reserved = self._sampler.reserved
        self._seq += 1
        self._write_text(  # type: ignore[misc]
            f"{self._seq},{elapsed:.6f},{where},{lineno},,{memory},{increment},{peak},{allocated},"
            f"{'' if reserved is None else reserved},{driver},{rss},{self._rank_cell}\n"
        )

    def event_row(
        self, event: str, label: str = "", where: tuple[str, str, int | None] = ("", "", None)
    ) -> None:
        """A timeline row for a non-line event (start, track, census, end), read now."""
        if self._timeline is None:
            return
        current, _ = self._sample()
        driver, rss = self._sampler.extras()
        if current > self.peak:
            self._offer(current, 0, None)
        allocated = current if self._on_cuda else None
        self._seq += 1
        self._timeline.write_row(
            TimelineRow(
                seq=self._seq,
                elapsed=round(self._clock() - self._start, 6),
                event=event,
                file=where[0],
                function=where[1],
                line=where[2],
                label=label,
                memory=current,
                allocated=allocated,
                reserved=self._sampler.reserved,
                driver=driver,
                rss=rss,
                rank=self.rank,
            )
        )


def _one_percent(peak: int) -> int:
    return peak // 100


def function_name(code: CodeType) -> str:
    """The qualified name where the Python records it (3.11+), else the plain name."""
    return getattr(code, "co_qualname", code.co_name)
