"""Stopping a long script early: once its loop's memory is steady, or at a budget.

A training loop of 100,000 steps repeats the same memory pattern after its first few
steps; on the simulated GPU (``run --simulate``) running all of it would take hours and
teach nothing more. ``LoopWatch`` sits between the tracing engine and the line profiler
(it forwards every event) and ends the script by raising :class:`StopRun` from the
tracer, a ``BaseException``: the script's ``except Exception`` does not catch it, its
``finally`` blocks and context managers run, and the runner writes every report.

**The iteration.** A loop completes an iteration when, in one frame, execution jumps
back from a line inside a ``for``/``while`` loop to that loop's header line (the header
is found in the source with ``ast``; Python reports a line event for it at every pass).
The watched loop (the *anchor*) is the first loop to iterate; it gives way to a loop
that encloses it (a loop around it in its function, or a loop in a shallower frame)
when that loop iterates, unless the anchor made more than ``inner_limit`` (64) passes
since the enclosing loop last iterated: an accumulation loop of micro-steps yields to
the optimizer-step loop around it, a batch loop stays the iteration inside its epoch
loop. A loop that starts after the anchor's, at its depth or deeper, takes over (the
timed loop after a warm-up loop); loops that run inside an iteration of the anchor (in
its body, or in functions it calls) are part of it. Loops in a ``forward`` method (a
model's loop over its layers) are never the iteration. While the anchor may be an inner
loop (a loop of its function encloses it, or the frames that called it are inside a
loop's body) it is not stopped for being steady before its ``inner_limit``-th pass: the
loop around it may still do what matters once per pass, such as the optimizer step.

**Steady.** At the end of each iteration the watch reads the run's high marks: the peak
of allocated memory, the peak of reserved memory, how many source lines have run and the
sum of every line's peak (see ``profiler.LineProfiler.high_marks``). Each only grows, so
two equal readings mean no line reached a new peak, no new line ran and neither peak
moved. After ``warmup`` iterations (2; the first builds the optimizer's state), memory
is steady when the reading stays the same for ``steady`` consecutive iterations (2):
the script is stopped at the loop's header, at the start of the next iteration. A leak
of even one byte per iteration raises a peak and keeps the run going.

**Budgets.** ``max_iterations`` (iterations of the anchor, counted from when it became
the anchor) and ``max_seconds`` (wall time since the script started, checked at every
line event) stop the run wherever it is, steady or not.

**Limits.** A branch taken only every N iterations (an evaluation every 500 steps) is
seen only if it ran before the stop; a script that catches ``BaseException`` (or uses a
bare ``except:``) around the loop swallows the stop once, and under ``sys.settrace``
tracing is off after the stop is raised, so the run then goes on untraced to its end.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from types import CodeType
from typing import Any

from ..runfolder.records import StopInfo
from .statements import parse_source

__all__ = ["LoopWatch", "StopInfo", "StopRule", "StopRun", "loop_spans"]

#: Names of functions whose loops are never the iteration (a model's loop over layers).
_STEP_FUNCTIONS = frozenset({"forward"})


@dataclass(frozen=True)
class StopRule:
    """When to stop a script early; see the module docstring. ``until_steady``: stop once
    memory is steady; ``warmup`` and ``steady``: iterations; ``max_iterations``: of the
    watched loop (None: no limit); ``max_seconds``: wall seconds since the script started
    (None: no limit); ``inner_limit``: passes of an inner loop per pass of its enclosing
    loop above which the inner loop is the iteration."""

    until_steady: bool = True
    warmup: int = 2
    steady: int = 2
    max_iterations: int | None = None
    max_seconds: float | None = None
    inner_limit: int = 64

    @property
    def active(self) -> bool:
        """Whether the rule can ever stop a run."""
        return self.until_steady or self.max_iterations is not None or self.max_seconds is not None


class StopRun(BaseException):
    """Raised from the tracer to end the script early (a ``BaseException``, so the script's
    ``except Exception`` lets it through); ``info`` says where and why."""

    def __init__(self, info: StopInfo) -> None:
        super().__init__(info.reason)
        self.info = info


def loop_spans(filename: str) -> dict[int, int]:
    """``{header line: last line}`` of every ``for``/``while`` loop (``async for`` too) in
    ``filename``'s source; empty when it cannot be read or parsed."""
    tree = parse_source(filename)
    if tree is None:
        return {}
    loops = (ast.For, ast.AsyncFor, ast.While)
    return {n.lineno: n.end_lineno or n.lineno for n in ast.walk(tree) if isinstance(n, loops)}


class _Frame:
    """A traced frame on the watch's stack: its code, the last line it ran, its loops."""

    __slots__ = ("code", "last", "loops")

    def __init__(self, code: CodeType, loops: dict[int, int]) -> None:
        self.code = code
        self.last = 0
        self.loops = loops

    def in_loop_body(self) -> bool:
        """Whether the line it is running lies inside a loop's body."""
        last = self.last
        return any(head < last <= end for head, end in self.loops.items())

    def encloses(self, header: int) -> bool:
        """Whether another loop of this frame's file contains the loop at ``header``."""
        end = self.loops[header]
        return any(h < header and end <= e for h, e in self.loops.items())


class _Anchor:
    """The watched loop, ``(code, header)``: the frame and depth it last iterated in, its
    iterations, its passes since an enclosing loop last iterated, and the steady count."""

    __slots__ = ("code", "header", "frame", "depth", "iterations", "passes", "last", "same")

    def __init__(self, frame: _Frame, header: int, depth: int) -> None:
        self.code, self.header = frame.code, header
        self.frame, self.depth = frame, depth
        self.iterations = 0  # since it became the anchor
        self.passes = 0  # since an enclosing loop last iterated
        self.last: Hashable = None
        self.same = 0


class LoopWatch:
    """A ``tracer.LineSink`` that forwards every event to ``sink`` (the profiler) and
    raises :class:`StopRun` when ``rule`` says stop; see the module docstring.

    ``marks()``: the run's high marks, compared between iterations (equal: nothing new).
    ``clock``: monotonic seconds, read at every line event when ``max_seconds`` is set.
    ``stopped`` holds the :class:`StopInfo` once raised.
    """

    def __init__(
        self,
        sink: Any,
        rule: StopRule,
        marks: Callable[[], Hashable],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._sink = sink
        self._rule = rule
        self._marks = marks
        self._clock = clock
        self._start = clock()
        self._deadline = None if rule.max_seconds is None else self._start + rule.max_seconds
        self._stack: list[_Frame] = []
        self._loops: dict[str, dict[int, int]] = {}
        self._anchor: _Anchor | None = None
        self.stopped: StopInfo | None = None

    # -- tracer.LineSink ----------------------------------------------------------------------

    def enter(self, code: CodeType) -> None:
        loops = self._loops.get(code.co_filename)
        if loops is None:
            loops = self._loops[code.co_filename] = loop_spans(code.co_filename)
        self._stack.append(_Frame(code, loops))
        self._sink.enter(code)

    def line(self, code: CodeType, lineno: int) -> None:
        stack = self._stack
        if not stack or stack[-1].code is not code:
            self.enter(code)  # an event the engine did not send: as the profiler does
        frame = stack[-1]
        end = frame.loops.get(lineno)
        if end is not None and lineno < frame.last <= end:
            frame.last = lineno
            self._iterated(frame, lineno)
        frame.last = lineno
        if self._deadline is not None:
            now = self._clock()
            if now >= self._deadline:
                self._stop("max-seconds", code.co_filename, lineno, now)
        self._sink.line(code, lineno)

    def leave(self, code: CodeType) -> None:
        stack = self._stack
        if stack and stack[-1].code is code:
            stack.pop()
        self._sink.leave(code)

    # -- the rule -----------------------------------------------------------------------------

    def _iterated(self, frame: _Frame, header: int) -> None:
        """The loop at ``header`` of the top frame completed an iteration: count it when it
        is the watched loop, or decide whether it becomes the watched loop."""
        if frame.code.co_name in _STEP_FUNCTIONS:
            return
        depth = len(self._stack) - 1
        anchor = self._anchor
        if anchor is None:
            anchor = self._anchor = _Anchor(frame, header, depth)
        elif anchor.code is frame.code and anchor.header == header:
            anchor.frame, anchor.depth = frame, depth
        elif self._encloses(frame, header, depth, anchor):
            if anchor.passes >= self._rule.inner_limit:
                anchor.passes = 0  # batches inside an epoch: the inner loop stays
                return
            anchor = self._anchor = _Anchor(frame, header, depth)
        elif self._inside(frame, header, depth, anchor):
            return  # part of the watched loop's iteration
        else:  # a loop after the watched one, at its depth or deeper
            anchor = self._anchor = _Anchor(frame, header, depth)
        self._count(anchor)

    def _encloses(self, frame: _Frame, header: int, depth: int, anchor: _Anchor) -> bool:
        """Whether the loop at ``header`` (top frame, ``depth``) is outside the watched one:
        in a shallower frame, or around it in the same function."""
        if depth < anchor.depth:
            return True
        if anchor.code is not frame.code:
            return False
        return header < anchor.header and frame.loops[anchor.header] <= frame.loops[header]

    def _inside(self, frame: _Frame, header: int, depth: int, anchor: _Anchor) -> bool:
        """Whether the loop at ``header`` runs within an iteration of the watched one: in
        its body, or in a frame called while the watched loop's frame is running."""
        if anchor.frame is frame:
            return anchor.header < header <= frame.loops[anchor.header]
        stack = self._stack
        return depth > anchor.depth and anchor.depth < len(stack) and stack[anchor.depth] is anchor.frame

    def _nested(self, anchor: _Anchor) -> bool:
        """Whether the watched loop may be an inner loop: a loop of its function encloses
        it, or the frames that called it are inside a loop's body."""
        if anchor.frame.encloses(anchor.header):
            return True
        return any(f.in_loop_body() for f in self._stack[: anchor.depth])

    def _count(self, anchor: _Anchor) -> None:
        rule = self._rule
        anchor.iterations += 1
        anchor.passes += 1
        file = anchor.code.co_filename
        if rule.max_iterations is not None and anchor.iterations >= rule.max_iterations:
            self._stop("max-iterations", file, anchor.header)
        if not rule.until_steady:
            return
        marks = self._marks()
        if anchor.iterations > rule.warmup:
            anchor.same = anchor.same + 1 if marks == anchor.last else 0
        anchor.last = marks
        if anchor.same >= rule.steady and (anchor.passes >= rule.inner_limit or not self._nested(anchor)):
            self._stop("steady", file, anchor.header)

    def _stop(self, reason: str, file: str, line: int, now: float | None = None) -> None:
        anchor = self._anchor
        loop = f"{anchor.code.co_filename}:{anchor.header}" if anchor is not None else ""
        self.stopped = StopInfo(
            reason=reason,
            file=file,
            line=line,
            iterations=anchor.iterations if anchor is not None else 0,
            seconds=round((self._clock() if now is None else now) - self._start, 3),
            loop=loop,
            warmup=self._rule.warmup,
            steady=self._rule.steady,
        )
        raise StopRun(self.stopped)
