"""What the stop rule (``steady.LoopWatch``) is told and keeps: :class:`StopRule` (when
to stop a loop), :class:`StopRun` (the exception that ends a script), and its state per
traced frame (:class:`WatchedFrame`: the frame's loops, its passes through each, the
allocator's event count when each was entered) and for the watched loop
(:class:`Anchor`: its iterations, those that worked on the GPU, the steady count; a
loop left before has one of its own each time it is entered again). See
``steady`` for the rule itself.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from types import CodeType

from ..runfolder.records import StopInfo
from .loops import Loop

__all__ = ["Anchor", "StopRule", "StopRun", "WatchedFrame"]


@dataclass(frozen=True)
class StopRule:
    """When to stop a loop early; see ``steady``'s docstring. ``until_steady``: once
    memory is steady; ``warmup`` and ``steady``: iterations; ``max_iterations``: of the
    watched loop (None: no limit); ``max_seconds``: wall seconds since the script started
    (None: no limit); ``inner_limit``: passes of an inner loop per pass of its enclosing
    loop above which the inner loop is the iteration; ``leave_loop``: leave the loop as a
    ``break`` would (True) or end the script (False)."""

    until_steady: bool = True
    warmup: int = 2
    steady: int = 2
    max_iterations: int | None = None
    max_seconds: float | None = None
    inner_limit: int = 64
    leave_loop: bool = True

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
    """The watched loop (or a loop left before, run again), ``(code, header)``: the frame and depth it last iterated in, its
    iterations (``worked``: those that worked on the GPU), its passes since an enclosing
    loop last iterated, the allocator's event count at its last header (``events``), the
    most memory allocated at its header (``high``) and the steady count."""

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
