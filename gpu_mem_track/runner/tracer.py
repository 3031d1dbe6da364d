"""Line events from the user's code only: ``sys.monitoring`` (3.12+) or ``sys.settrace``.

Both engines drive the same ``LineSink`` with three events, each in the thread that
started the engine:

- ``enter(code)``: a frame of a wanted code object starts or resumes (a call, a generator
  resuming);
- ``line(code, lineno)``: a new line starts in the innermost wanted frame;
- ``leave(code)``: that frame returns, yields, or is left by an exception.

Which code objects are wanted is asked once per code object (``wants(code)``); code that
is not wanted costs one callback the first time it runs (``sys.monitoring``: the callback
then disables itself at that location) or one dictionary lookup per call (``settrace``).
Other threads are not traced. A sink may offer native callbacks for ``sys.monitoring``
(``monitoring_callbacks(wanted, decide, main)`` returning ``(start, throw, leave, line)``
that do what this engine's own do, or None): the profiler does where its native line sink
is built.

The wanted code objects are kept by ``id`` (``{id(code): code}``), never hashed: a code
object's hash is computed anew from its bytecode and constants at every lookup, nested
code objects included (80 us for a large module's), and ``sys.monitoring`` calls back at
every module an import runs, at every frame an exception unwinds and at every exception
thrown into a generator, in any code (``PY_UNWIND`` and ``PY_THROW`` cannot be switched
off where they happen): 29,000 callbacks while ``torch.optim.Adam`` first imports
``torch._dynamo`` (8,000 code objects started, 11,500 frames unwound, 9,000 exceptions
thrown into generators; ``reports/bench_runner_native_py312.md``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Protocol

__all__ = ["ENGINES", "LineSink", "MonitoringEngine", "SettraceEngine", "best_engine", "engine_class"]


class LineSink(Protocol):
    def enter(self, code: CodeType) -> None: ...

    def line(self, code: CodeType, lineno: int) -> None: ...

    def leave(self, code: CodeType) -> None: ...


Wants = Callable[[CodeType], bool]


class SettraceEngine:
    """``sys.settrace``: a global trace function that returns a local one for wanted code."""

    name = "sys.settrace"

    def __init__(self, sink: LineSink, wants: Wants) -> None:
        self._sink = sink
        self._wants = wants
        # id(code): (code, wanted); the id hashes far faster than the code object (hashed
        # anew from its fields at every lookup), and the entry keeps the code alive
        self._decided: dict[int, tuple[CodeType, bool]] = {}
        self._previous: Any = None
        self._thread: int | None = None
        self._local: Callable[[FrameType, str, Any], Any] | None = None

    @staticmethod
    def available() -> bool:
        return True

    def start(self) -> None:
        self._previous = sys.gettrace()
        self._thread = threading.get_ident()
        self._local = self._local_function()
        sys.settrace(self._global)

    def stop(self) -> None:
        sys.settrace(self._previous)
        self._previous = None

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        entry = self._decided.get(id(code))
        if entry is None:
            entry = self._decided[id(code)] = (code, bool(self._wants(code)))
        if not entry[1] or event != "call":
            return None
        self._sink.enter(code)
        return self._local

    def _local_function(self) -> Callable[[FrameType, str, Any], Any]:
        """The local trace function of wanted frames: called at every line, so a closure
        over the sink's methods rather than a method looking them up each time."""
        line, leave = self._sink.line, self._sink.leave

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                line(frame.f_code, frame.f_lineno)
            elif event == "return":  # also after an exception, and at a generator's yield
                leave(frame.f_code)
            return local

        return local


class MonitoringEngine:
    """``sys.monitoring`` (PEP 669): line, start, resume, return, yield and unwind events,
    switched off location by location for code that is not wanted."""

    name = "sys.monitoring"

    def __init__(self, sink: LineSink, wants: Wants) -> None:
        self._sink = sink
        self._wants = wants
        self._wanted: dict[int, CodeType] = {}  # id(code): code (see the module docstring)
        self._tool: int | None = None

    @staticmethod
    def available() -> bool:
        return hasattr(sys, "monitoring")

    def start(self) -> None:
        mon = sys.monitoring
        for tool in (mon.PROFILER_ID, 3, 4, 1):
            if mon.get_tool(tool) is None:
                break
        else:
            raise RuntimeError("every sys.monitoring tool slot is in use (another profiler?)")
        mon.use_tool_id(tool, "gpu_mem_track")
        self._tool = tool
        # what an earlier engine in this process switched off (DISABLE) stays off until
        # this: code it did not want may be wanted now
        mon.restart_events()
        events = mon.events
        sink = self._sink
        wanted = self._wanted
        disable = mon.DISABLE

        main = threading.get_ident()
        get_ident = threading.get_ident

        def decide(code: CodeType, offset: int) -> Any:
            # A code object not wanted so far, seen starting: asked once; not wanted, it is
            # switched off whichever thread runs it first (a data loader's thread would
            # otherwise call back at every call it makes); only the main thread's frames
            # reach the sink.
            if self._wants(code):
                wanted[id(code)] = code
                mon.set_local_events(tool, code, events.LINE | events.PY_RETURN | events.PY_YIELD)
                if get_ident() == main:
                    sink.enter(code)
                return None
            return disable

        def on_start(code: CodeType, offset: int) -> Any:
            if id(code) in wanted:
                if get_ident() == main:
                    sink.enter(code)
                return None
            return decide(code, offset)

        def on_throw(code: CodeType, offset: int, exception: BaseException) -> Any:
            if id(code) in wanted and get_ident() == main:  # global event: never DISABLE
                sink.enter(code)
            return None

        def on_leave(code: CodeType, offset: int, value: Any) -> Any:
            if id(code) in wanted and get_ident() == main:
                sink.leave(code)
            return None

        def on_line(code: CodeType, lineno: int) -> Any:
            if get_ident() == main:
                sink.line(code, lineno)
            return None

        native = getattr(sink, "monitoring_callbacks", None)
        fast = native(wanted, decide, main) if native is not None else None
        if fast is not None:  # the sink's own native callbacks, doing what the ones above do
            on_start, on_throw, on_leave, on_line = fast  # type: ignore[assignment]
        mon.register_callback(tool, events.PY_START, on_start)
        mon.register_callback(tool, events.PY_RESUME, on_start)
        mon.register_callback(tool, events.PY_THROW, on_throw)
        mon.register_callback(tool, events.PY_RETURN, on_leave)
        mon.register_callback(tool, events.PY_YIELD, on_leave)
        mon.register_callback(tool, events.PY_UNWIND, on_leave)
        mon.register_callback(tool, events.LINE, on_line)
        # PY_UNWIND and PY_THROW can only be enabled globally; their callbacks filter.
        mon.set_events(tool, events.PY_START | events.PY_RESUME | events.PY_THROW | events.PY_UNWIND)

    def stop(self) -> None:
        if self._tool is None:
            return
        mon = sys.monitoring
        mon.set_events(self._tool, 0)
        for code in self._wanted.values():
            mon.set_local_events(self._tool, code, 0)
        for event in (
            mon.events.PY_START,
            mon.events.PY_RESUME,
            mon.events.PY_THROW,
            mon.events.PY_RETURN,
            mon.events.PY_YIELD,
            mon.events.PY_UNWIND,
            mon.events.LINE,
        ):
            mon.register_callback(self._tool, event, None)
        mon.free_tool_id(self._tool)
        self._tool = None


ENGINES = {"monitoring": MonitoringEngine, "settrace": SettraceEngine}


def engine_class(choice: str = "auto") -> type[MonitoringEngine] | type[SettraceEngine]:
    """``sys.monitoring`` where the Python has it, else ``sys.settrace``; ``choice``
    (``"auto"``, ``"monitoring"``, ``"settrace"``) forces one. ``ValueError`` if the forced
    engine is not available here."""
    if choice == "auto":
        choice = "monitoring" if MonitoringEngine.available() else "settrace"
    if choice not in ENGINES:
        raise ValueError(f"unknown tracing engine {choice!r} (auto, monitoring, settrace)")
    engine = ENGINES[choice]
    if not engine.available():
        raise ValueError(f"sys.monitoring needs Python 3.12+, this is {sys.version.split()[0]}")
    return engine


def best_engine(sink: LineSink, wants: Wants, choice: str = "auto") -> MonitoringEngine | SettraceEngine:
    """An engine of ``engine_class(choice)`` driving ``sink`` for the code ``wants`` accepts."""
    return engine_class(choice)(sink, wants)
