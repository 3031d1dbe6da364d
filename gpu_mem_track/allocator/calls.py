"""The calls a recorded trace is replayed as, and the device that answers them as the
recorded GPU did (see ``replay`` for how both are used)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..snapshotfile.records import TraceEntry
from .device import SimulatedDevice

__all__ = ["Call", "ReplayDevice", "plan_calls"]

_SEGMENT_ACTIONS = ("segment_alloc", "segment_free")
#: Pages mapped into or out of an expandable segment.
_MAPPING_ACTIONS = ("segment_map", "segment_unmap")
_RELEASES = ("segment_free", "segment_unmap")
_GROWTH = ("segment_alloc", "segment_map")
#: Events of an allocation that needed the device.
_DEVICE_ACTIONS = ("segment_free", "segment_alloc", "oom", *_MAPPING_ACTIONS)


@dataclass(frozen=True)
class Call:
    """One call to replay: ``kind`` (``malloc``, ``oom``, ``free``, ``complete``,
    ``empty_cache``), the index and entry of its recorded event (for ``empty_cache``,
    its first ``segment_free``), the events torch recorded for it before that one, and
    for a ``free`` whether its completion comes later (``deferred``).

    A deferred free completed just before an allocation that needed the device (a
    segment event or an OOM follows) belongs to that allocation: torch completes pending
    frees before releasing the cache, or at the start of ``malloc`` when their streams are
    done; either way the block did not serve the request, so it is completed by the
    simulator's own release or, failing that, right after the allocation."""

    kind: str
    index: int
    entry: TraceEntry
    segment_events: tuple[tuple[int, TraceEntry], ...] = ()
    deferred: bool = False


class ReplayDevice(SimulatedDevice):
    """A device that answers each call as the recorded GPU did (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(None, base=1 << 60)  # fresh addresses never collide with real ones
        self.expected: list[TraceEntry] = []
        self.frees_needed = 0
        self.refuse = False
        self.frees_done = lambda: 0
        self._live: dict[int, int] = {}  # segments the model holds: address -> bytes

    def plan(self, call: Call, frees_done: Callable[[], int]) -> None:
        recorded = [e for _, e in call.segment_events] if call.segment_events else ()
        self.expected = [e for e in recorded if e.action == "segment_alloc"]
        self.frees_needed = sum(1 for e in recorded if e.action == "segment_free")
        self.refuse = call.kind == "oom"
        self.frees_done = frees_done

    def malloc(self, size: int) -> int | None:
        if self.refuse or self.frees_done() < self.frees_needed:
            return None
        address = None
        if self.expected:
            recorded = self.expected.pop(0)
            if recorded.size == size and not self._overlaps(recorded.addr, size):
                self._used += size
                address = recorded.addr
        # A model that kept a segment torch released must not get a second one at its address.
        address = super().malloc(size) if address is None else address
        if address is not None:
            self._live[address] = size
        return address

    def free(self, address: int, size: int) -> None:
        super().free(address, size)
        self._live.pop(address, None)

    def adopt(self, address: int, size: int) -> None:
        super().adopt(address, size)
        self._live[address] = size

    def _overlaps(self, address: int, size: int) -> bool:
        return any(
            start < address + size and address < start + length for start, length in self._live.items()
        )


def plan_calls(trace: Sequence[TraceEntry]) -> tuple[list[Call], int]:
    """The calls to replay, in order, and the number of events whose decisions are not
    compared (expandable segments' map/unmap: replayed with their call, see ``replay``).
    See the module doc for how events are grouped."""
    return _Planner(trace).run()


class _Planner:
    """Groups a trace's events into calls. Segment events wait for the allocation (or
    OOM) that caused them; so do completions of deferred frees that a release inside
    that allocation forced (torch synchronizes pending frees before releasing)."""

    def __init__(self, trace: Sequence[TraceEntry]) -> None:
        self.trace = trace
        self.calls: list[Call] = []
        self.waiting: list[tuple[int, TraceEntry]] = []
        self.frames: dict[int, bool] = {}
        self.skipped = 0

    def run(self) -> tuple[list[Call], int]:
        for index, entry in enumerate(self.trace):
            self.step(index, entry)
        self.flush()
        return self.calls, self.skipped

    def step(self, index: int, e: TraceEntry) -> None:
        action = e.action
        self.skipped += action in _MAPPING_ACTIONS
        if action in _RELEASES and self.emptying(e):
            self.empty_cache(index, e)
        elif action in _SEGMENT_ACTIONS or action in _MAPPING_ACTIONS:
            self.waiting.append((index, e))
        elif action in ("alloc", "oom"):
            kind = "malloc" if action == "alloc" else "oom"
            if kind == "malloc" and not self.claims(e):
                self.release_apart()
            self.calls.append(Call(kind, index, e, tuple(self.waiting)))
            self.waiting.clear()
        elif action == "free_requested":
            self.flush()
            self.calls.append(Call("free", index, e, deferred=not self.completed_at_once(index, e)))
        elif action == "free_completed":
            self.completed(index, e)

    def claims(self, alloc: TraceEntry) -> bool:
        """Whether the waiting releases can be the allocation's own: torch releases the
        cache inside ``malloc`` only after ``cudaMalloc`` failed, then asks again (a new
        segment follows), and records the releases with the allocation's stack."""
        releases = [w for _, w in self.waiting if w.action in _RELEASES]
        if not releases:
            return True
        if not any(w.action in _GROWTH for _, w in self.waiting):
            return False
        return all(not w.frames or not alloc.frames or w.frames == alloc.frames for w in releases)

    def release_apart(self) -> None:
        """Replay the waiting releases (and what waited before them) as an
        ``empty_cache`` recorded without its frames; the segments allocated after the
        last one stay with the allocation."""
        last = max(i for i, (_, w) in enumerate(self.waiting) if w.action in _RELEASES)
        after = self.waiting[last + 1 :]
        del self.waiting[last + 1 :]
        self.flush()
        self.waiting.extend(after)

    def emptying(self, entry: TraceEntry) -> bool:
        """Whether a segment_free (or unmap) carries ``empty_cache`` frames (stacks are
        shared)."""
        key = id(entry.frames)
        if key not in self.frames:
            self.frames[key] = any("empty_cache" in f.name or "emptyCache" in f.name for f in entry.frames)
        return self.frames[key]

    def empty_cache(self, index: int, e: TraceEntry) -> None:
        self.flush()
        last = self.calls[-1] if self.calls else None
        if last is not None and last.kind == "empty_cache" and last.segment_events[-1][0] == index - 1:
            self.calls[-1] = Call("empty_cache", last.index, last.entry, (*last.segment_events, (index, e)))
        else:
            self.calls.append(Call("empty_cache", index, e, ((index, e),)))

    def completed_at_once(self, index: int, e: TraceEntry) -> bool:
        """Whether a free completes at once: its completion follows with the same stack
        (torch records both with the free's context; a completion forced later carries
        the context of the call that forced it). Without stacks, adjacency decides."""
        following = self.trace[index + 1] if index + 1 < len(self.trace) else None
        if following is None or following.action != "free_completed" or following.addr != e.addr:
            return False
        return not e.frames or following.frames == e.frames

    def completed(self, index: int, e: TraceEntry) -> None:
        last = self.calls[-1] if self.calls else None
        if last is not None and last.kind == "free" and last.index == index - 1 and not last.deferred:
            return  # replayed with its free
        following = index + 1
        while following < len(self.trace) and self.trace[following].action == "free_completed":
            following += 1
        nxt = self.trace[following] if following < len(self.trace) else None
        if nxt is not None and nxt.action in _DEVICE_ACTIONS and not self.emptying(nxt):
            self.waiting.append((index, e))  # part of the allocation to come (see ``Call``)
            return
        self.flush()
        self.calls.append(Call("complete", index, e))

    def flush(self) -> None:
        """Events no allocation claimed: completions replay alone, segment frees (and
        unmaps) as an ``empty_cache`` recorded without frames."""
        frees = tuple(item for item in self.waiting if item[1].action != "free_completed")
        for index, e in self.waiting:
            if e.action == "free_completed":
                self.calls.append(Call("complete", index, e))
        if frees:
            self.calls.append(Call("empty_cache", frees[0][0], frees[0][1], frees))
        self.waiting.clear()
