"""Ending a long loop early: once its memory is steady, or at a budget.

A training loop of 100,000 steps repeats the same memory pattern after its first few
steps; on the simulated GPU (``run --simulate``) running all of it would take hours and
teach nothing more. ``LoopWatch`` sits between the tracing engine and the line profiler
(it forwards every event) and, when the rule says stop, **leaves the loop as a ``break``
would**: the rest of its iterations are skipped and the script goes on after it (its
own prints of ``max_memory_allocated()``, its snapshot dump, its summary run). With
``StopRule(leave_loop=False)`` (``run --end-script``) it ends the whole script instead,
by raising :class:`StopRun` from the tracer, a ``BaseException``: the script's ``except
Exception`` does not catch it, its ``finally`` blocks and context managers run, and the
runner writes every report.

**The iteration.** A loop completes an iteration when, in one frame, execution jumps
back from a line inside a ``for``/``while`` loop to that loop's header line (the header
is found in the source with ``ast``; Python reports a line event for it at every pass).
The watched loop (the *anchor*) is the first loop to iterate; it gives way to a loop
that encloses it (a loop around it in its function, or a loop in a shallower frame)
when that loop iterates, unless the anchor made more than ``inner_limit`` (64) passes
since the enclosing loop last iterated: an accumulation loop of micro-steps yields to
the optimizer-step loop around it, a batch loop not yet steady after 64 passes stays
the iteration inside its epoch loop (one steady sooner is left alone, below). A loop
that starts after the anchor's, at its depth or deeper, takes over (the timed loop
after a warm-up loop); loops that run inside an iteration of the anchor (in
its body, or in functions it calls) are part of it, except loops left before (below).
Loops in a ``forward`` method (a model's loop over its layers) or in an ``__init__`` (a
model's constructor building its layers, a dataset's preparing its items), and in the
functions they call, are never the iteration.

**Steady.** At the end of each iteration the watch reads the run's high marks: the peak
of allocated memory, the peak of reserved memory, how many source lines have run and the
sum of every line's peak (see ``profiler.LineProfiler.high_marks``). Each only grows, so
two equal readings mean no line reached a new peak, no new line ran and neither peak
moved. Where the run's allocator counts its allocations and frees (``activity``: the
CUDA sampler, real or simulated), an iteration counts only when it **worked on the GPU**
(the count moved since the previous pass of the header, or since the loop was entered),
and the reading also holds the highest memory allocated at the header, which must stop
rising: a loop whose iterations allocate nothing on the GPU (a model built on the CPU
before ``.to("cuda")``, data prepared on the CPU, a configuration sweep) is never steady
and runs whole, as is a loop whose memory at the header keeps growing (layers built on
the GPU, a list of losses kept as tensors); batches of varying sizes only delay it until
the largest has been seen. After ``warmup`` such iterations (2; the first builds
the optimizer's state), memory is steady when the reading stays the same for
``steady`` consecutive ones (2). A leak of even one byte per iteration raises a peak and
keeps the run going.

**Leaving the loop.** At the loop's header, at the start of the next iteration, the
watch moves the frame to the line a ``break`` would go on at (``loops.Loop.exit``, set
as ``frame.f_lineno``: CPython allows that jump from a line event, under
``sys.settrace`` and ``sys.monitoring`` alike, and pops a ``for`` loop's iterator). The
loops around it are left too, so that a ``while True:`` whose only way out is a
``break`` on a counter ends: a loop of the same function that encloses it, and a loop
whose body a calling frame is running (an epoch loop around a ``train()`` call), are
each left when execution next reaches their header, after the rest of their current
iteration (an evaluation, a checkpoint) ran once. The watch then watches again, so a
later long loop (an evaluation loop after training) is left once steady too.

**Left alone.** Some loops are left alone, only as a ``break``: the loops around them go
on. *An inner loop* (a loop of its function encloses it, or the frames that called it
are inside a loop's body) steady before its ``inner_limit``-th pass: the rest of the
enclosing body runs (the optimizer step after the micro-steps, ``zero_grad``, an epoch's
evaluation) and the loop around it becomes the watched loop, left once its own
iterations are steady (at least ``warmup + steady`` of them, the first optimizer step's
state included). *An evaluation loop* (steady while autograd records nothing: under
``torch.no_grad()`` or ``inference_mode``, as ``grad_enabled`` reads it), whatever its
passes: nanoGPT's ``estimate_loss()`` batches, its split loop and the training loop go
on. *A loop left before* (its ``(code, header)``), each time it is entered again and
steady again, counted from that entry (it was steady once: ``again_warmup`` of warm-up,
1, and ``again_steady`` unchanged readings, 1: the micro-step that allocates the
gradients again after ``zero_grad``, then one that accumulates into them), even
within an iteration of the watched loop (the 'val' split after the 'train' split, each
``estimate_loss()`` call, the micro-steps of each optimizer step); it is never the
watched loop again. A loop is not left alone at its last pass (nothing to skip), nor
where its ``break`` would leave a loop around it too (it ends that loop's body) or
Python refuses the jump (a pad in a file the runner did not compile): an inner loop then
runs on and is left with the loops around it at its ``inner_limit``-th pass, the others
run on. Under ``leave_loop=False`` nothing is left alone: an inner loop is stopped at its
``inner_limit``-th pass. How many iterations were skipped is counted where
``loops.remaining`` can know it (``range``, a sized iterable such as a ``DataLoader``),
and said where not (a ``while`` loop, a generator); ``StopInfo`` gives the first stop,
the other loops left, and each loop left more than once with how often and how many
iterations were skipped in all.

**When a loop cannot be left** (``loops``: the last statement of a function, of a
``with`` block, of an ``except`` or ``finally``; or the jump is refused), the watch
ends the script there instead, as ``--end-script`` does, and the report says why.

**Budgets.** ``max_iterations`` (iterations of the anchor, counted from when it became
the anchor, or of a loop left before, from its entry; only those that worked on the GPU,
where ``activity`` tells) leaves the loop as steady memory does (an inner loop before
its ``inner_limit``-th pass alone, where it can; else with the loops around it);
``max_seconds`` (wall time since the script started, checked at every line event) ends
the script wherever it is.

**Limits.** A branch taken only every N iterations (an evaluation every 500 steps) is
seen only if it ran before the stop; a script that catches ``BaseException`` (or uses a
bare ``except:``) around the loop swallows an end of the script once, and under
``sys.settrace`` tracing is off after the stop is raised, so the run then goes on
untraced to its end. An accumulation loop left alone skips its last micro-steps: a
DDP script that syncs gradients only on the last one (``no_sync``, nanoGPT's
``require_backward_grad_sync``) runs no synced backward (``--run-to-end`` runs it).
Leaving the enclosing loops also ends a sweep (``for batch_size
in (16, 32, 64): train(batch_size)``) after its first pass. On Python 3.12 and later a
jump binds ``None`` to the function's local variables that were still unbound (CPython's
``f_lineno`` setter does so, so that no instruction reads a missing local).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import replace
from types import CodeType, FrameType
from typing import Any

from ..runfolder.records import StopInfo
from .loops import PAD_LINE, Loop, jump, loop_table, remaining, running_frame, unsilence
from .stoprule import Anchor, Leaves, StopRule, StopRun, WatchedFrame, encloses, inside, nested, verdict

__all__ = ["LoopWatch", "StopInfo", "StopRule", "StopRun", "loop_spans"]

#: Functions whose loops, and their callees' loops, are never the iteration: a model's
#: loop over its layers, a constructor building layers or preparing data.
_NEVER_LEFT = frozenset({"forward", "__init__", "__post_init__"})


def loop_spans(filename: str) -> dict[int, int]:
    """``{header line: last line}`` of every ``for``/``while`` loop (``async for`` too) in
    ``filename``'s source; empty when it cannot be read or parsed."""
    return {header: loop.end for header, loop in loop_table(filename).items()}


class LoopWatch:
    """A ``tracer.LineSink`` that forwards every event to ``sink`` (the profiler) and
    leaves the watched loop, or raises :class:`StopRun`, when ``rule`` says stop; see
    the module docstring.

    ``marks()``: the run's high marks, compared between iterations (equal: nothing new).
    ``clock``: monotonic seconds, read at every line event when ``max_seconds`` is set.
    ``grad_enabled()``: whether autograd records at the moment (``torch.is_grad_enabled``;
    None: always); a loop left while it does not is an evaluation, left alone.
    ``activity()``: ``(bytes allocated now, allocations plus frees so far, out-of-memory
    errors so far)`` of the run's allocator, read at loop headers (None where nothing counts
    them: every iteration then counts, and the memory at the header is not compared). An
    iteration that ran out of memory is never steady: a loop that catches the error and
    retries with a smaller batch goes on until it fits.
    ``stopped`` holds the :class:`StopInfo` of the first stop (with the loops left after
    it), None while the run has not been stopped.
    """

    def __init__(
        self,
        sink: Any,
        rule: StopRule,
        marks: Callable[[], Hashable],
        clock: Callable[[], float] = time.perf_counter,
        activity: Callable[[], tuple[int, int, int]] | None = None,
        grad_enabled: Callable[[], bool] | None = None,
    ) -> None:
        self._sink = sink
        self._activity = activity
        self._grad_enabled = grad_enabled
        self._rule = rule
        self._marks = marks
        self._clock = clock
        self._start = clock()
        self._deadline = None if rule.max_seconds is None else self._start + rule.max_seconds
        self._stack: list[WatchedFrame] = []
        self._tables: dict[str, tuple[dict[int, Loop], dict[int, int]]] = {}
        self._anchor: Anchor | None = None
        self._leaves = Leaves()
        self._known: set[tuple[CodeType, int]] = set()  # loops left once: left again when steady
        self._stuck: set[tuple[CodeType, int]] = set()  # loops Python would not let us leave alone
        self._pending: list[tuple[WatchedFrame, int]] = []
        self._filter: Any = None  # the warnings filter of a jump, until the next line event

    @property
    def leaves_loops(self) -> bool:
        """Whether a stop leaves the loop (the script is best compiled with
        ``loops.pad_loops``) rather than ending the script."""
        return self._rule.leave_loop

    @property
    def stopped(self) -> StopInfo | None:
        """The first stop, with every loop left after it and each loop left more than once
        (how many times, how many iterations were skipped in all) (None: not stopped)."""
        return self._leaves.stopped()

    # -- tracer.LineSink ----------------------------------------------------------------------

    def enter(self, code: CodeType) -> None:
        tables = self._tables.get(code.co_filename)
        if tables is None:
            table = loop_table(code.co_filename)
            tables = self._tables[code.co_filename] = (table, {h: loop.end for h, loop in table.items()})
        self._stack.append(WatchedFrame(code, *tables))
        self._sink.enter(code)

    def line(self, code: CodeType, lineno: int) -> None:
        if self._filter is not None:
            self._filter = unsilence(self._filter)
        if lineno >= PAD_LINE:
            return  # a pad of ``loops.pad_loops``, not a line of the script
        stack = self._stack
        if not stack or stack[-1].code is not code:
            self.enter(code)  # an event the engine did not send: as the profiler does
        frame = stack[-1]
        end = frame.loops.get(lineno)
        if end is not None:
            back = lineno < frame.last <= end
            frame.passes[lineno] = frame.passes.get(lineno, 0) + 1 if back else 0
            if not back:  # the loop is entered
                if self._activity is not None:
                    frame.entered[lineno] = self._activity()[1]
                if frame.again:
                    frame.again.pop(lineno, None)
            if self._pending and (frame, lineno) in self._pending:
                self._leave_around(frame, lineno)
                return
            if back:
                frame.last = lineno
                if self._iterated(frame, lineno):
                    return
        frame.last = lineno
        if self._deadline is not None:
            now = self._clock()
            if now >= self._deadline:
                info = self._info("max-seconds", code.co_filename, lineno, now)
                if self._leaves.first is None:
                    raise StopRun(self._record(info))
                self._end(info, "--max-seconds reached", ended_at=f"{code.co_filename}:{lineno}")
        self._sink.line(code, lineno)

    def leave(self, code: CodeType) -> None:
        stack = self._stack
        if stack and stack[-1].code is code:
            stack.pop()
        self._sink.leave(code)

    # -- the rule -----------------------------------------------------------------------------

    def _iterated(self, frame: WatchedFrame, header: int) -> bool:
        """The loop at ``header`` of the top frame completed an iteration: count it when it
        is the watched loop or a loop left before, or decide whether it becomes the watched
        loop. True when the watch left the loop (the line event was forwarded as the jump's
        target)."""
        if any(f.code.co_name in _NEVER_LEFT for f in self._stack):
            return False  # a model's loop or constructor, or a function they call
        depth = len(self._stack) - 1
        if (frame.code, header) in self._known:
            return self._again(frame, header, depth)
        anchor = self._anchor
        if anchor is None:
            anchor = self._anchor = Anchor(frame, header, depth)
        elif anchor.code is frame.code and anchor.header == header:
            anchor.frame, anchor.depth = frame, depth
        elif encloses(frame, header, depth, anchor):
            if anchor.passes >= self._rule.inner_limit:
                anchor.passes = 0  # batches inside an epoch: the inner loop stays
                return False
            anchor = self._anchor = Anchor(frame, header, depth)
        elif inside(self._stack, frame, header, depth, anchor):
            return False  # part of the watched loop's iteration
        else:  # a loop after the watched one, at its depth or deeper
            anchor = self._anchor = Anchor(frame, header, depth)
        return self._count(anchor)

    def _count(self, anchor: Anchor) -> bool:
        """Count an iteration of the watched loop; True when it was left."""
        reason = verdict(anchor, self._rule, self._marks, self._activity)
        if reason is None:
            return False
        rule = self._rule
        info = self._info(reason, anchor.code.co_filename, anchor.header, state=anchor)
        early = anchor.passes < rule.inner_limit and nested(self._stack, anchor)
        if not rule.leave_loop:
            if reason == "steady" and early:
                return False  # the loop around it may not have done its step yet
            raise StopRun(self._record(info))
        evaluation = self._grad_enabled is not None and not self._grad_enabled()
        if evaluation or early:
            left = self._leave_only(self._stack[-1], info)
            if left:
                self._anchor = None  # the loop around it (or a later one) is watched next
                return True
            if left is None or evaluation or reason == "steady":
                return False  # its last pass, or no break that leaves it alone: it runs on
        return self._stop(info)

    def _again(self, frame: WatchedFrame, header: int, depth: int) -> bool:
        """An iteration of a loop left before, entered again (an evaluation called again,
        the micro-steps of the next optimizer step): counted from its entry, and left
        again, alone, once the rule says so. True when it was left."""
        state = frame.again.get(header)
        if state is None:
            state = frame.again[header] = Anchor(frame, header, depth)
        reason = verdict(state, self._rule, self._marks, self._activity, again=True)
        if reason is None or not self._rule.leave_loop:
            return False
        return bool(self._leave_only(frame, self._info(reason, frame.code.co_filename, header, state=state)))

    # -- stopping -----------------------------------------------------------------------------

    def _info(
        self, reason: str, file: str, line: int, now: float | None = None, state: Anchor | None = None
    ) -> StopInfo:
        anchor = state or self._anchor
        loop = f"{anchor.code.co_filename}:{anchor.header}" if anchor is not None else ""
        return StopInfo(
            reason=reason,
            file=file,
            line=line,
            iterations=anchor.iterations if anchor is not None else 0,
            seconds=round((self._clock() if now is None else now) - self._start, 3),
            loop=loop,
            warmup=self._rule.warmup,
            steady=self._rule.steady,
        )

    def _record(self, info: StopInfo) -> StopInfo:
        """Keep ``info`` as the first stop (a later one is only listed in ``left``)."""
        if self._leaves.first is None:
            self._leaves.first = info
        return info

    def _leave_only(self, frame: WatchedFrame, info: StopInfo) -> bool | None:
        """Leave the loop at ``info.line`` of the top frame as a ``break`` would, and no
        loop around it; False (nothing done) when its ``break`` would leave a loop around
        it too, or there is no line to go on at; None (nothing done) on its last pass,
        which ends it as it would."""
        loop = frame.table.get(info.line)
        if loop is None or loop.exit is None or loop.through or (frame.code, loop.header) in self._stuck:
            return False
        real = running_frame(frame.code)
        skipped = remaining(loop, real, frame.passes.get(loop.header, 0)) if real is not None else None
        if skipped == 0:
            return None
        if self._leave(frame, loop, info, alone=True, found=(real, skipped)):
            return True
        self._stuck.add((frame.code, loop.header))  # a pad in a file the runner did not compile
        return False

    def _stop(self, info: StopInfo) -> bool:
        """Leave the watched loop (the top frame's, at its header) and the loops around it,
        each at its header, or end the script where no jump can leave it."""
        frame = self._stack[-1]
        loop = frame.table.get(info.line)
        if loop is None or loop.exit is None:
            where = f"{info.file}:{info.line}"
            self._end(info, _ONE_LINE % where, ended_at=where)
        self._leave(frame, loop, info)  # type: ignore[arg-type]
        self._anchor = None  # watch again: a later long loop is left once steady too
        pending = [(frame, h) for h in loop.enclosing if h not in loop.through]  # type: ignore[union-attr]
        pending += [(f, h) for f in self._stack[:-1] for h in f.around()]
        self._pending += [p for p in pending if p not in self._pending]
        return True

    def _leave(
        self,
        frame: WatchedFrame,
        loop: Loop,
        info: StopInfo,
        alone: bool = False,
        found: tuple[Any, int | None] | None = None,
    ) -> bool:
        """Jump out of ``loop`` (the top frame's) and note it: the first stop, or one more.
        False where Python refused the jump and ``alone`` (else the script was ended).
        ``found``: its running frame and the iterations it had left, when the caller has
        read them already."""
        if found is None:
            real = running_frame(frame.code)
            skipped = remaining(loop, real, frame.passes.get(loop.header, 0)) if real is not None else None
        else:
            real, skipped = found
        if not self._jump(frame, real, loop, info, alone):
            return False
        frame.again.pop(loop.header, None)
        where = f"{info.file}:{loop.header}"
        self._known.add((frame.code, loop.header))
        if self._leaves.first is None:
            padded = loop.exit >= PAD_LINE  # type: ignore[operator]
            resumed = f"{info.file}:{loop.end if padded else loop.exit}"
            self._leaves.first = replace(
                info, action="left-loop", skipped=skipped, resumed=resumed, resumed_after=padded
            )
        self._leaves.add(where)
        for header in loop.through:
            self._leaves.add(f"{info.file}:{header}")
        self._leaves.count(where, skipped)
        return True

    def _leave_around(self, frame: WatchedFrame, header: int) -> None:
        """Execution reached the header of a loop around a loop that was left: leave it."""
        self._pending.remove((frame, header))
        loop = frame.table[header]
        where = f"{frame.code.co_filename}:{header}"
        if loop.exit is None:
            info = self._leaves.first or self._info("steady", frame.code.co_filename, header)
            self._end(info, _ONE_LINE % where, ended_at=where)
        self._jump(frame, running_frame(frame.code), loop, None)
        for left in (where, *(f"{frame.code.co_filename}:{h}" for h in loop.through)):
            self._leaves.add(left)
        self._pending = [p for p in self._pending if not (p[0] is frame and p[1] in loop.through)]

    def _jump(
        self,
        frame: WatchedFrame,
        real: FrameType | None,
        loop: Loop,
        info: StopInfo | None,
        alone: bool = False,
    ) -> bool:
        """Move the running frame to ``loop.exit`` and tell the profiler that line started
        (the jump's target gets no line event of its own). Where Python refuses, end the
        script, or with ``alone`` return False (the loop runs on)."""
        where = f"{frame.code.co_filename}:{loop.header}"
        try:
            if real is None:
                raise ValueError("its frame was not found")
            if self._filter is not None:
                self._filter = unsilence(self._filter)
            self._filter = jump(real, loop.exit)  # type: ignore[arg-type]
        except ValueError as exc:
            if alone:
                return False
            base = info or self._leaves.first or self._info("steady", frame.code.co_filename, loop.header)
            refused = f"Python refused to leave the loop at {where} ({exc})"
            self._end(base, _CANNOT % where if loop.exit >= PAD_LINE else refused, ended_at=where)  # type: ignore[operator]
        frame.last = loop.exit  # type: ignore[assignment]
        for header in (loop.header, *loop.through):
            frame.passes.pop(header, None)
        if loop.exit < PAD_LINE:  # type: ignore[operator]
            self._sink.line(frame.code, loop.exit)
        return True

    def _end(self, info: StopInfo, note: str, ended_at: str = "") -> None:
        """End the script where it is, saying why the loop could not be left."""
        if self._leaves.first is None:
            self._leaves.first = replace(info, note=note)
        else:
            self._leaves.first = replace(self._leaves.first, note=note, ended_at=ended_at)
        raise StopRun(self._leaves.first)


_ONE_LINE = (
    "the loop at %s is written on one line (no line event of its own to leave it at), so the script "
    "was ended there"
)
_CANNOT = (
    "the loop at %s is the last statement of its function, or of a with, except or finally block, "
    "in a file the runner did not compile (no line to go on at), so the script was ended there"
)
