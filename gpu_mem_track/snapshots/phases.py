"""The phase of every entry of a trace, read in order: a stack alone does not show
backward when autograd's engine made the allocation.

The engine runs backward on its own threads, whose stacks hold no Python frame (C++
frames only, or none with ``stacks="python"``), while the program's thread waits inside
``backward()``; so a real nanoGPT trace puts 30 GiB of backward's allocations in
``other``. Read in order, the trace shows when a backward call runs: it starts with the
first entry whose stack holds the call (``Tensor.backward``, ``torch.autograd.backward``
or ``torch.autograd.grad``: the ``ones_like`` of the loss's gradient, usually) and lasts
until the program's thread is seen doing something else. Meanwhile an entry whose own
stack says ``other`` (``attribution``) belongs to backward when it has

- no Python frame (the engine's threads);
- the Python stack of the line that called backward and nothing inside it (an entry that
  ``run --snapshot`` gave the line that was running, or a C++ call of that line);
- a Python stack whose outermost function is not the program thread's (a hook the engine
  called, a backward call nested in one, as activation checkpointing makes).

The call has ended at the first entry whose outermost function is the program thread's
and whose stack is another one. What a stack shows by itself (forward, optimizer) stays.
An entry without any frame made during the call is also charged to the line that called
backward (``TraceReading.owners``), as ``run --snapshot`` charges it to the line running,
instead of to ``<no frames>``; one with C++ frames keeps its autograd node
(``<backward> MmBackward0``).

What this cannot know: a backward call whose start the ring buffer dropped is not seen
(its engine's entries stay ``other``, at ``<no frames>``, until the next call), and a
Python hook run on the program's thread during the call (none does in torch) would end
it early.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..snapshotfile.records import Frame, TraceEntry
from .attribution import Attributor, Site, is_backward_call

__all__ = ["TraceReading", "read_trace", "trace_phases"]

_Stack = tuple[tuple[str, int, str], ...]


@dataclass(frozen=True)
class TraceReading:
    """A trace read in order: ``phases``, each entry's phase; ``owners``, by entry index,
    the line whose backward call was running when an entry without any frame was made
    (the site it is charged to instead of ``<no frames>``)."""

    phases: tuple[str, ...]
    owners: Mapping[int, Site] = field(default_factory=dict)

    def site(self, index: int, frames: Sequence[Frame], attributor: Attributor) -> Site:
        """The site of entry ``index`` (whose stack is ``frames``)."""
        owner = self.owners.get(index)
        return owner if owner is not None else attributor.describe(frames)[0]


def trace_phases(trace: Sequence[TraceEntry], attributor: Attributor) -> list[str]:
    """The phase (``attribution.CATEGORIES``) of each entry of ``trace``, in order."""
    return list(read_trace(trace, attributor).phases)


def read_trace(trace: Sequence[TraceEntry], attributor: Attributor) -> TraceReading:
    """Read ``trace`` in order (see the module docstring)."""
    phases: list[str] = []
    owners: dict[int, Site] = {}
    stacks: dict[int, tuple[Sequence[Frame], _Stack, _Stack | None]] = {}
    running: _Stack | None = None  # the Python stack of the line whose backward call runs
    line = Site("", "", 0)  # that line's site
    for index, entry in enumerate(trace):
        site, own = attributor.describe(entry.frames)
        stack, caller = _stacks(entry.frames, stacks)
        main = running is not None and bool(stack) and _thread(stack) == _thread(running)
        if caller is not None and (running is None or main):
            running, line, phase = caller, site, "backward"  # the program's thread calls backward
        elif running is None:
            phase = own
        elif main and stack != running:
            running, phase = None, own  # the program's thread moved on
        else:
            phase = "backward" if own == "other" else own  # the engine, or the caller's line
            if not entry.frames:
                owners[index] = line
        phases.append(phase)
    return TraceReading(tuple(phases), owners)


def _thread(stack: _Stack) -> tuple[str, str]:
    """The outermost frame's file and function: the same for every stack of one thread
    (its line moves as the program runs)."""
    return stack[-1][0], stack[-1][2]


def _stacks(
    frames: Sequence[Frame], seen: dict[int, tuple[Sequence[Frame], _Stack, _Stack | None]]
) -> tuple[_Stack, _Stack | None]:
    """The Python frames of a stack (innermost first) and, when it holds a backward call,
    the frames outside the outermost one (the caller's stack; None otherwise). Stacks are
    shared among entries, so each is examined once."""
    known = seen.get(id(frames))
    if known is not None and known[0] is frames:
        return known[1], known[2]
    python = [f for f in frames if f.filename.endswith(".py")]
    calls = [i for i, f in enumerate(python) if is_backward_call(f)]
    stack = tuple((f.filename, f.line, f.name) for f in python)
    caller = stack[calls[-1] + 1 :] if calls and calls[-1] + 1 < len(stack) else None
    seen[id(frames)] = (frames, stack, caller)
    return stack, caller
