"""The native line sink (``line_sink.cpp``) gives what the Python line profiler gives.

The same workloads run through ``LineProfiler`` twice, Python only and with the native
sink, under each tracing engine this Python has, with a deterministic clock: the timeline
files must be byte for byte the same, and so must the line records, the run's peak and
where it is named, the snapshot windows and the census calls.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from gpu_mem_track.native import build, linesink, load_built
from gpu_mem_track.runfolder.files import TimelineWriter
from gpu_mem_track.runner.profiler import LineProfiler
from gpu_mem_track.runner.samplers import FakeSampler
from gpu_mem_track.runner.tracer import ENGINES

ENGINE_NAMES = [name for name, engine in ENGINES.items() if engine.available()]


@pytest.fixture(scope="module")
def line_sink(tmp_path_factory):
    """The module built for this Python and torch into a fresh folder (skips where it
    cannot be built here: no compiler or no torch headers)."""
    root = tmp_path_factory.mktemp("native")
    target = build.build(root=root, name=build.LINE_MODULE)
    if target.missing:
        pytest.skip(f"cannot build the line sink here: {target.missing}")
    assert target.built, (target.folder / "build.log").read_text()
    module, problem = load_built(build.LINE_MODULE, target.module, linesink.ABI, target.torch_version)
    assert module is not None, problem
    return module


class Clock:
    """A clock that moves 0.001234567 s at every reading."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.001234567
        return self.now


class CudaLike(FakeSampler):
    """A fake sampler shaped as the CUDA one: reserved bytes and their peak, the event
    count, and a native read (``_read``) giving the same five figures ``sample()`` reads."""

    source = "cuda allocator"

    def __init__(self) -> None:
        super().__init__()
        self.reserved = 0
        self.reserved_peak = 0
        self._index = 0
        self._read = self._figures

    def allocate(self, nbytes: int) -> None:
        super().allocate(nbytes)
        if self.current > self.reserved:
            self.reserved = self.current + 2048
            self.reserved_peak = max(self.reserved_peak, self.reserved)

    def _figures(self, index: int) -> tuple[int, int, int, int, int]:
        assert index == 0
        return self.current, self.high, self.reserved, self.reserved_peak, self.events

    def sample(self) -> tuple[int, int]:
        allocated, peak, self.reserved, self.reserved_peak, self.events = self._read(self._index)
        return allocated, peak

    def extras(self) -> tuple[int | None, int | None]:
        return (self.current * 3 if self.events % 2 else None), 12345


class Windows:
    def __init__(self) -> None:
        self.items: list[tuple] = []

    def add(self, code, lineno, start, end, before, after) -> None:
        self.items.append((code.co_name, lineno, start, end, before, after))


def grow(s, n):
    s.allocate(n)
    return n


def spike(s, n):
    s.allocate(n)
    s.free(n)


def chunks(s):
    for i in range(3):
        s.allocate(10 + i)
        yield i


def fails(s):
    s.allocate(7)
    raise ValueError("expected")


def catches(s):
    try:
        yield 1
    except KeyError:  # thrown in (PY_THROW): the generator resumes here
        s.allocate(3)
        yield 2
    finally:
        s.free(3)


def not_traced():
    raise KeyError("unwinds through a frame the engine does not want")


def recurse(s, depth):
    if depth:
        s.allocate(depth)
        recurse(s, depth - 1)
    s.free(depth)


def workload(s):
    total = 0
    for i in range(40):
        total += grow(s, 64)
        spike(s, 5000 if i == 30 else 100)  # a new peak late in the run
        total += grow(
            s,
            grow(s, 1),
        )
        s.free(66)
    total += sum(chunks(s))
    try:
        fails(s)
    except ValueError:
        pass
    recurse(s, 4)
    grow(s, 20_000)  # above the census threshold
    x = 0
    x += 1  # noqa: E702 - two statements on one line
    s.free(20_000)
    thrown = catches(s)
    next(thrown)
    thrown.throw(KeyError("into the generator"))
    thrown.close()  # GeneratorExit thrown in, then unwinding it
    try:
        not_traced()
    except KeyError:
        pass
    return total


WANTED = {f.__code__ for f in (grow, spike, chunks, catches, fails, recurse, workload)}


def profile(tmp_path: Path, engine_name: str, sampler_class: type, module) -> dict:
    sampler = sampler_class()
    windows = Windows()
    censuses: list[tuple] = []
    path = tmp_path / f"timeline-{engine_name}-{sampler_class.__name__}-{module is not None}.csv"
    timeline = TimelineWriter(path)

    def census(code, lineno, increment):
        censuses.append((code.co_name, lineno, increment))
        sampler.allocate(3)  # a census that moves memory: the next line starts after it

    profiler = LineProfiler(
        sampler,
        timeline,
        census,
        threshold=10_000,
        extras_every=0.01,
        clock=Clock(),
        windows=windows if sampler_class is CudaLike else None,
        rank=3 if sampler_class is CudaLike else None,
        line_sink=module,
    )
    assert profiler.native == (module is not None)
    profiler.event_row("start", where=("script.py", "<module>", None))
    engine = ENGINES[engine_name](profiler, lambda code: code in WANTED)
    engine.start()
    try:
        workload(sampler)
    finally:
        engine.stop()
    profiler.finish()
    profiler.event_row("end")
    timeline.close()
    return {
        "timeline": path.read_bytes(),
        "records": profiler.records(),
        "peak": profiler.peak,
        "peak_at": profiler.peak_at,
        "high_marks": profiler.high_marks(),
        "windows": windows.items,
        "censuses": censuses,
    }


@pytest.mark.parametrize("sampler_class", [FakeSampler, CudaLike])
@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
def test_the_native_sink_gives_what_python_gives(tmp_path, line_sink, engine_name, sampler_class):
    python = profile(tmp_path, engine_name, sampler_class, None)
    native = profile(tmp_path, engine_name, sampler_class, line_sink)
    assert native["timeline"] == python["timeline"]
    assert native == python
    # the workload did reach what the comparison is about
    rows = python["timeline"].decode().splitlines()
    assert len(rows) > 400
    # the allocating line, then the call around it (which also holds the first census's 3 B)
    big = workload.__code__.co_firstlineno + 16
    allocating = grow.__code__.co_firstlineno + 1
    assert python["censuses"] == [("grow", allocating, 20_000), ("workload", big, 20_003)]
    assert python["peak_at"] == (__file__, grow.__code__.co_firstlineno + 1)
    hits = {(r.function, r.line): r.hits for r in python["records"]}
    assert hits[("workload", workload.__code__.co_firstlineno + 5)] == 40  # spread over 4 lines: once each
    if sampler_class is CudaLike:
        assert len(python["windows"]) > 100
        assert all(row.endswith(",3") for row in rows[1:])
        assert any(r.reserved_peak for r in python["records"])


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
def test_python_runs_only_the_rare_lines(tmp_path, line_sink, engine_name, monkeypatch):
    """With the native sink, the profiler's Python ``line`` runs for a code object's first
    line only (its statement table is read there), not for the loop's lines."""
    calls: list[str] = []
    original = LineProfiler._python_line

    def counting(self, code, lineno):
        calls.append(code.co_name)
        original(self, code, lineno)

    monkeypatch.setattr(LineProfiler, "_python_line", counting)
    profile(tmp_path, engine_name, FakeSampler, line_sink)
    functions = (grow, spike, chunks, catches, fails, recurse, workload)
    assert sorted(calls) == sorted(f.__code__.co_name for f in functions)


def thread_then_grow(profiler, sampler, wants, work) -> list[tuple[str, int]]:
    """Under the monitoring engine feeding ``profiler`` (tracing the code ``wants``
    accepts): ``work`` in a thread of its own, then ``grow(sampler, 7)`` in this one.
    Returns each record's (function, increment)."""
    engine = ENGINES["monitoring"](profiler, wants)
    engine.start()
    try:
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        grow(sampler, 7)
    finally:
        engine.stop()
    profiler.finish()
    return [(r.function, r.increment) for r in profiler.records()]


def test_other_threads_are_not_traced_by_the_native_callbacks(tmp_path, line_sink):
    if "monitoring" not in ENGINE_NAMES:
        pytest.skip("sys.monitoring needs Python 3.12+")
    sampler = FakeSampler()
    profiler = LineProfiler(sampler, line_sink=line_sink)
    records = thread_then_grow(profiler, sampler, lambda code: code in WANTED, lambda: grow(sampler, 5))
    assert records == [("grow", 7), ("grow", 0)]


def test_native_off_keeps_the_python_path(monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "off")
    monkeypatch.setattr(linesink, "_state", {"module": None, "looked": False, "note": ""})
    assert linesink.module() is None
    assert "off" in linesink.status()
    assert LineProfiler(FakeSampler()).native is False


def test_a_sampler_error_reaches_the_program_as_in_python(tmp_path, line_sink):
    class Broken(FakeSampler):
        def sample(self):
            if self.events:
                raise RuntimeError("read failed")
            return super().sample()

    sampler = Broken()
    profiler = LineProfiler(sampler, line_sink=line_sink)
    code = grow.__code__
    profiler.enter(code)
    profiler.line(code, code.co_firstlineno + 1)  # first seen: the Python path
    sampler.allocate(1)
    with pytest.raises(RuntimeError, match="read failed"):
        profiler.line(code, code.co_firstlineno + 2)
    assert sys.exc_info() == (None, None, None)


def test_elapsed_seconds_are_written_as_python_writes_them(line_sink):
    """The rows' ``f"{elapsed:.6f}"``, formatted natively: ties (exact halves of a
    microsecond in binary) go to even, as Python's correctly rounded formatting does."""
    import random

    rng = random.Random(7)
    values = [0.0, -0.0, 0.0078125, 0.0000005, 1.0000005, 2.5e-7, 7.5e-7, 1e-300, 123456.9999995, 5e8, 2e9]
    values += [-1.5e-6, float("inf"), float("nan")]
    values += [rng.uniform(0, 10) for _ in range(20_000)] + [rng.uniform(0, 1e6) for _ in range(20_000)]
    values += [k / 2**20 for k in range(0, 2**20, 97)]  # many exact binary fractions, ties among them
    written = [(v, line_sink.format_seconds(v), f"{v:.6f}") for v in values]
    mismatches = [w for w in written if w[1] != w[2]]
    assert mismatches == []
    assert line_sink.format_seconds(0.0078125) == "0.007812"
    assert line_sink.format_seconds(0.0234375) == "0.023438"


def worker_only(n):
    return n + 1


@pytest.mark.parametrize("native", [False, True])
def test_code_a_thread_runs_is_switched_off_there_too(line_sink, native):
    """Code that is not wanted costs one callback in any thread, not one per call: a
    data loader's thread keeps running Python the whole run."""
    if "monitoring" not in ENGINE_NAMES:
        pytest.skip("sys.monitoring needs Python 3.12+")
    asked: list[str] = []

    def wants(code):
        asked.append(code.co_name)
        return code in WANTED

    sampler = FakeSampler()
    profiler = LineProfiler(sampler, line_sink=line_sink if native else None)
    records = thread_then_grow(profiler, sampler, wants, lambda: [worker_only(i) for i in range(50)])
    assert asked.count("worker_only") == 1
    assert records == [("grow", 7), ("grow", 0)]


def test_an_engine_sees_code_an_earlier_engine_switched_off(line_sink):
    if "monitoring" not in ENGINE_NAMES:
        pytest.skip("sys.monitoring needs Python 3.12+")
    results = []
    for wanted in (set(), {grow.__code__}):
        sampler = FakeSampler()
        profiler = LineProfiler(sampler, line_sink=line_sink)
        engine = ENGINES["monitoring"](profiler, lambda code, wanted=wanted: code in wanted)
        engine.start()
        try:
            grow(sampler, 3)
        finally:
            engine.stop()
        profiler.finish()
        results.append([(r.function, r.increment) for r in profiler.records()])
    assert results == [[], [("grow", 3), ("grow", 0)]]


@pytest.mark.parametrize("threshold", [2**63, 10**20])
def test_a_census_threshold_above_int64_is_never_reached_as_in_python(line_sink, threshold):
    """``--census-threshold 100EiB`` parses to an int above 2**63: no increment reaches it,
    natively as in Python (it must not raise OverflowError into the user's program)."""
    results = []
    for module in (None, line_sink):
        calls: list[tuple] = []
        sampler = FakeSampler()
        census = lambda *args, calls=calls: calls.append(args)  # noqa: E731
        profiler = LineProfiler(sampler, None, census, threshold, line_sink=module)
        code = grow.__code__
        profiler.enter(code)
        profiler.line(code, code.co_firstlineno + 1)
        sampler.allocate(64)
        profiler.line(code, code.co_firstlineno + 2)
        profiler.leave(code)
        results.append((calls, [(r.line, r.increment) for r in profiler.records()]))
    assert results[0] == results[1]
    assert results[1][0] == []
    assert results[1][1][0][1] == 64


@pytest.mark.parametrize("junk", [[1, 2], "junk", ("a", "b")])
def test_finish_ends_with_a_foreign_item_on_the_stack(line_sink, junk):
    """An item that is not a frame, put on the profiler's stack from Python, is popped by
    finish() (natively it was left there: finish() looped forever)."""
    profiler = LineProfiler(FakeSampler(), line_sink=line_sink)
    profiler.enter(grow.__code__)
    profiler._stack.append(junk)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (profiler.finish(), done.set()), daemon=True)
    worker.start()
    worker.join(20)
    assert done.is_set()
    assert profiler._stack == []
