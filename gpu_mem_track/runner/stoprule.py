"""What the stop rule (``steady.LoopWatch``) is told and keeps: :class:`StopRule` (when
to stop a loop), :class:`StopRun` (the exception that ends a script), and its state per
traced frame (:class:`WatchedFrame`: the frame's loops, its passes through each, the
allocator's event count when each was entered) and for the watched loop
(:class:`Anchor`: its iterations, those that worked on the GPU, the steady count; a
loop left before has one of its own each time it is entered again), how an iteration is
counted (:func:`verdict`), where a loop lies from the watched one (:func:`encloses`,
:func:`inside`, :func:`nested`) and what was left (:class:`Leaves`). See
``steady`` for the rule itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from types import CodeType

from ..runfolder.records import StopInfo
from .loops import Loop

__all__ = [
    "Anchor",
    "Leaves",
    "StopRule",
    "StopRun",
    "WatchedFrame",
    "encloses",
    "inside",
    "nested",
    "verdict",
]


@dataclass(frozen=True)
class StopRule:
    """When to stop a loop early; see ``steady``'s docstring. ``until_steady``: once
    memory is steady; ``warmup`` and ``steady``: iterations; ``max_iterations``: of the
    watched loop (None: no limit); ``max_seconds``: wall seconds since the script started
    (None: no limit); ``inner_limit``: passes of an inner loop per pass of its enclosing
    loop above which the inner loop is the iteration; ``leave_loop``: leave the loop as a
    ``break`` would (True) or end the script (False); ``again_warmup`` and
    ``again_steady``: iterations, for a loop left before and entered again (it was steady
    once already: its first pass of the new entry is the warm-up, one unchanged reading
    after it is enough)."""

    until_steady: bool = True
    warmup: int = 2
    steady: int = 2
    max_iterations: int | None = None
    max_seconds: float | None = None
    inner_limit: int = 64
    leave_loop: bool = True
    again_warmup: int = 1
    again_steady: int = 1

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


class WatchedFrame:
    """A traced frame on the watch's stack: its code, the last line it ran, its loops
    (``{header: last line}`` and the ``loops.Loop`` records), per loop header the
    iterations completed since execution last entered that loop, the allocator's
    event count when it was entered (``entered``; kept only with an ``activity``), and
    per header of a loop left before (``again``) the count of its iterations since it was
    entered this time (an :class:`Anchor` of its own)."""

    __slots__ = ("code", "last", "loops", "table", "passes", "entered", "again")

    def __init__(self, code: CodeType, table: dict[int, Loop], loops: dict[int, int]) -> None:
        self.code = code
        self.last = 0
        self.table = table
        self.loops = loops
        self.passes: dict[int, int] = {}
        self.entered: dict[int, int] = {}
        self.again: dict[int, Anchor] = {}

    def in_loop_body(self) -> bool:
        """Whether the line it is running lies inside a loop's body."""
        last = self.last
        return any(head < last <= end for head, end in self.loops.items())

    def encloses(self, header: int) -> bool:
        """Whether another loop of this frame's file contains the loop at ``header``."""
        end = self.loops[header]
        return any(h < header and end <= e for h, e in self.loops.items())

    def around(self) -> list[int]:
        """Headers of the loops whose body holds the line it is running."""
        last = self.last
        return [head for head, end in self.loops.items() if head < last <= end]


class Anchor:
    """The watched loop (or a loop left before, run again), ``(code, header)``: the frame
    and depth it last iterated in, its iterations (``worked``: those that worked on the
    GPU), its passes since an enclosing loop last iterated, the allocator's event count at
    its last header (``events``), the most memory allocated at its header (``high``) and
    the steady count."""

    __slots__ = (
        "code",
        "header",
        "frame",
        "depth",
        "iterations",
        "worked",
        "passes",
        "events",
        "high",
        "last",
        "same",
    )

    def __init__(self, frame: WatchedFrame, header: int, depth: int) -> None:
        self.code, self.header = frame.code, header
        self.frame, self.depth = frame, depth
        self.iterations = 0  # since it became the anchor
        self.worked = 0
        self.events: int | None = None
        self.high = 0  # the most memory allocated at its header
        self.passes = 0  # since an enclosing loop last iterated
        self.last: Hashable = None
        self.same = 0


def encloses(frame: WatchedFrame, header: int, depth: int, anchor: Anchor) -> bool:
    """Whether the loop at ``header`` (of ``frame``, the top frame, at ``depth``) is
    outside the watched one: in a shallower frame, or around it in the same function."""
    if depth < anchor.depth:
        return True
    if anchor.code is not frame.code:
        return False
    return header < anchor.header and frame.loops[anchor.header] <= frame.loops[header]


def inside(stack: list[WatchedFrame], frame: WatchedFrame, header: int, depth: int, anchor: Anchor) -> bool:
    """Whether the loop at ``header`` (of ``frame``, the top of ``stack``) runs within an
    iteration of the watched one: in its body or header (a generator it iterates), or in a
    frame called from there (not from after it: nanoGPT's ``estimate_loss()`` is called
    after the loop over the optimizer's param groups)."""
    if anchor.frame is frame:
        return anchor.header < header <= frame.loops[anchor.header]
    caller = anchor.frame
    if not (depth > anchor.depth and anchor.depth < len(stack) and stack[anchor.depth] is caller):
        return False
    return anchor.header <= caller.last <= caller.loops[anchor.header]  # the header: a generator


def nested(stack: list[WatchedFrame], anchor: Anchor) -> bool:
    """Whether the watched loop may be an inner loop: a loop of its function encloses it,
    or the frames that called it (in ``stack``) are inside a loop's body."""
    if anchor.frame.encloses(anchor.header):
        return True
    return any(f.in_loop_body() for f in stack[: anchor.depth])


def verdict(
    state: Anchor,
    rule: StopRule,
    marks: Callable[[], Hashable],
    activity: Callable[[], tuple[int, int, int]] | None,
    again: bool = False,
) -> str | None:
    """Count an iteration of the loop ``state`` follows (``marks`` and ``activity`` as
    ``steady.LoopWatch`` reads them): ``"steady"`` or ``"max-iterations"`` when the rule
    says it may be left, None while it runs on. ``again``: a loop left before, entered
    again (``rule.again_warmup`` and ``rule.again_steady`` apply)."""
    state.iterations += 1
    state.passes += 1
    reading: Hashable = None
    if activity is not None:
        allocated, events, ooms = activity()
        before = state.events if state.events is not None else state.frame.entered.get(state.header)
        state.events = events
        if before is None or events == before:
            state.same, state.last = 0, None
            return None  # no work on the GPU in this iteration: not a step
        state.high = max(state.high, allocated)
        reading = (state.high, ooms)  # a new out-of-memory error: not steady
    state.worked += 1
    if rule.max_iterations is not None and state.worked >= rule.max_iterations:
        return "max-iterations"
    if not rule.until_steady:
        return None
    reading = (marks(), reading)
    warmup, steady = (rule.again_warmup, rule.again_steady) if again else (rule.warmup, rule.steady)
    if state.worked > warmup:
        state.same = state.same + 1 if reading == state.last else 0
    state.last = reading
    return "steady" if state.same >= steady else None


class Leaves:
    """What the watch left: the first stop (``first``), the other loops left after it
    (each once, in order) and per loop left by the rule at its header how many times and
    how many iterations were skipped (None once a count was not known)."""

    def __init__(self) -> None:
        self.first: StopInfo | None = None
        self.left: list[str] = []
        self.tally: dict[str, list] = {}  # file:line -> [times left, iterations skipped]

    def add(self, where: str) -> None:
        """List ``where`` among the loops left after the first stop (each once)."""
        if self.first is not None and where != self.first.loop and where not in self.left:
            self.left.append(where)

    def count(self, where: str, skipped: int | None) -> None:
        """The rule left the loop at ``where`` once more, skipping ``skipped`` iterations."""
        tally = self.tally.setdefault(where, [0, 0])
        tally[0] += 1
        tally[1] = None if tally[1] is None or skipped is None else tally[1] + skipped

    def stopped(self) -> StopInfo | None:
        """The first stop with every loop left after it and each loop left more than once
        (None: not stopped)."""
        if self.first is None:
            return None
        repeats = tuple(
            f"{where} {n} times, "
            + (
                "how many skipped not known"
                if skipped is None
                else f"{skipped:,} iteration(s) skipped in all"
            )
            for where, (n, skipped) in self.tally.items()
            if n > 1
        )
        if not self.left and not repeats:
            return self.first
        return replace(self.first, left=(*self.first.left, *self.left), repeats=repeats)
