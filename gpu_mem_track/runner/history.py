"""What ``run --snapshot`` records while the script runs: the CUDA allocator's history
(``HistoryRecorder``; torch's is ``TorchHistory``) and, per line execution, which of the
allocator's events happened inside it (``LineWindows``).

The allocator counts its allocations and frees (``allocation.all.allocated`` and
``.freed`` in its statistics) under the same lock with which it records each one as an
``alloc`` or ``free_requested`` trace entry. The runner reads that count (the sampler's
``events``) when a line starts and when it ends, so the entries made while the line ran
are exactly those numbered ``start + 1`` to ``end``, whatever thread made them and
whether or not their stacks name the line: no clocks are compared.

Nothing here imports torch at module import.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType
from typing import Any, Protocol

__all__ = ["DEFAULT_ENTRIES", "HistoryRecorder", "LineWindows", "TorchHistory"]

#: Trace entries kept by default (``--snapshot-entries``): the ring buffer's size.
DEFAULT_ENTRIES = 100_000


class HistoryRecorder(Protocol):
    """Records the allocator's history; injectable, so tests use a fake.

    ``start(max_entries)``: record from now on (or from when the program starts CUDA),
    keeping the last ``max_entries`` trace entries; ``dump(path)``: write the snapshot
    (``torch.cuda.memory._dump_snapshot``'s pickle) and return True, or False when
    nothing was recorded; ``stop()``: stop recording (also when nothing was). ``note``:
    why nothing is recorded, when so (one line; "" otherwise).
    """

    note: str

    def start(self, max_entries: int) -> None: ...

    def dump(self, path: Path) -> bool: ...

    def stop(self) -> None: ...


class TorchHistory:
    """``torch.cuda.memory._record_memory_history`` and ``_dump_snapshot``.

    ``start`` imports torch but does not start CUDA: recording begins when the program
    starts CUDA (``torch.cuda._lazy_call`` runs it right after CUDA's initialisation,
    before any allocation), or at once if it already has. It records every allocation
    and free with the Python stack of both (``context="all"``, so a free names the line
    that freed) but no C++ frames (``stacks="python"``: unwinding and symbolising C++
    costs far more, and the runner places each entry by count, not by stack). Torch
    before 2.1 takes the older keywords (``trace_alloc_max_entries``); a torch with
    neither records nothing and says so in ``note``.
    """

    def __init__(self) -> None:
        self.note = ""
        self.recording = False
        self._armed = False
        self._calls: tuple[Callable[[], Any], Callable[[], Any]] | None = None
        self._memory: Any = None

    def start(self, max_entries: int) -> None:
        import torch

        self._memory = torch.cuda.memory
        self._calls = history_calls(self._memory, max_entries)
        if self._calls is None:
            self.note = f"torch {torch.__version__} cannot record memory history (torch 2.0 or later can)"
            return
        self._armed = True
        lazy = getattr(torch.cuda, "_lazy_call", None)
        if lazy is None:  # no hook for CUDA's start: record from now on
            self._begin()
        else:
            lazy(self._begin)

    def _begin(self) -> None:
        # Runs inside torch's CUDA initialisation: an error here must not become the script's.
        if not self._armed or self.recording or self._calls is None:
            return
        try:
            self._calls[0]()
            self.recording = True
        except Exception as exc:  # noqa: BLE001 - reported in the run's notes instead
            self.note = f"torch could not record memory history: {exc}"

    def dump(self, path: Path) -> bool:
        if not self.recording:
            return False
        dump = getattr(self._memory, "_dump_snapshot", None)
        if dump is not None:
            dump(str(path))
        else:
            import pickle

            with open(path, "wb") as handle:
                pickle.dump(self._memory._snapshot(), handle)
        return True

    def stop(self) -> None:
        self._armed = False
        if self.recording and self._calls is not None:
            self.recording = False
            self._calls[1]()


def history_calls(memory: Any, max_entries: int) -> tuple[Callable[[], Any], Callable[[], Any]] | None:
    """(start, stop) calls of ``memory`` (``torch.cuda.memory``) for this torch's
    ``_record_memory_history``, or None when it has none that records a trace."""
    record = getattr(memory, "_record_memory_history", None)
    if record is None:
        return None
    try:
        names = set(inspect.signature(record).parameters)
    except (TypeError, ValueError):
        names = set()
    if "max_entries" in names or hasattr(memory, "_record_memory_history_legacy"):
        return (
            lambda: record(enabled="all", context="all", stacks="python", max_entries=max_entries),
            lambda: record(enabled=None),
        )
    if "trace_alloc_max_entries" in names:  # torch 2.0
        return (
            lambda: record(
                True,
                record_context=True,
                trace_alloc_max_entries=max_entries,
                trace_alloc_record_context=True,
            ),
            lambda: record(False),
        )
    return None


class LineWindows:
    """The line executions during which the allocator counted events: (code, line, start,
    end, before, after) with ``start``/``end`` the count (``CudaSampler.events``) and
    ``before``/``after`` the allocated bytes when it began and ended, in the order they
    ended (``profiler.LineProfiler``'s ``windows``).

    Bounded: the trace keeps at most ``keep`` entries, so an execution that ended more
    than ``keep`` events ago cannot be in it; it is forgotten and counted in
    ``forgotten`` (per (code, line)), so its line's peak is not claimed exact.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.forgotten: dict[tuple[CodeType, int], int] = {}
        self._items: deque[tuple[CodeType, int, int, int, int, int]] = deque()

    def add(self, code: CodeType, lineno: int, start: int, end: int, before: int, after: int) -> None:
        items = self._items
        items.append((code, lineno, start, end, before, after))
        floor = end - self.keep
        while items[0][3] <= floor:
            old = items.popleft()
            key = (old[0], old[1])
            self.forgotten[key] = self.forgotten.get(key, 0) + 1

    def __iter__(self) -> Iterator[tuple[CodeType, int, int, int, int, int]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
