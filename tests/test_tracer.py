"""The tracing engines and the line profiler, with a fake memory source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import engine_workload
import pytest

from gpu_mem_track.runner.profiler import LineProfiler
from gpu_mem_track.runner.samplers import FakeSampler
from gpu_mem_track.runner.tracer import MonitoringEngine, SettraceEngine, best_engine

ROOT = Path(__file__).resolve().parents[1]


def run_traced(profiler: LineProfiler, func) -> None:
    """Call ``func()`` with the settrace engine tracing its lines only."""
    engine = SettraceEngine(profiler, lambda code: code is func.__code__)
    engine.start()
    try:
        func()
    finally:
        engine.stop()


def by_line(records: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["function"], r["line"]): r for r in records if "line" in r}


def line_of(text: str) -> int:
    source = Path(engine_workload.__file__).read_text().splitlines()
    return next(i for i, line in enumerate(source, start=1) if line.strip().startswith(text))


def check_workload(records: list[dict]) -> None:
    lines = by_line(records)
    allocate = lines[("inner", line_of("s.allocate(100)"))]
    assert (allocate["hits"], allocate["increment"]) == (3, 300)
    transient = lines[("inner", line_of("spike(s, 50)"))]
    # memory is the same before and after; the peak 50 B above it comes from the mark
    assert transient["increment"] == 0
    assert transient["peak"] == transient["memory"] + 50 and transient["peak_exact"]
    calls = lines[("workload", line_of("inner(s)"))]
    assert (calls["hits"], calls["increment"]) == (3, 300)  # callees included
    assert lines[("chunks", line_of("s.allocate(10)"))]["increment"] == 20
    assert lines[("workload", line_of("total = sum(chunks(s))"))]["increment"] == 20
    assert lines[("fails", line_of("s.allocate(7)"))]["increment"] == 7
    assert lines[("workload", line_of("fails(s)"))]["increment"] == 7
    freed = lines[("workload", line_of("s.free(327)"))]
    assert (freed["increment"], freed["memory"], freed["peak_exact"]) == (-327, 0, False)
    summary = records[-1]
    assert summary["peak"] == 350
    # a call spread over four lines runs twice: two hits of its first line, nothing else
    first = line_of("touch(")
    assert lines[("spread", first)]["hits"] == 2
    assert not any(key[0] == "spread" and first < key[1] <= first + 4 for key in lines)


def test_settrace_engine_profiles_the_workload():
    check_workload(engine_workload.profile_workload("settrace"))


def test_monitoring_engine_profiles_the_workload_like_settrace():
    interpreter = engine_workload.python312()
    if interpreter is None:
        pytest.skip("no Python 3.12+ here")
    done = subprocess.run(
        [interpreter, engine_workload.__file__, "monitoring", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    check_workload(records)
    assert records == engine_workload.profile_workload("settrace")


def test_engines_restore_what_was_there():
    sampler = FakeSampler()
    engine = SettraceEngine(LineProfiler(sampler), lambda code: False)
    engine.start()
    engine.stop()
    assert sys.gettrace() is None
    if MonitoringEngine.available():
        engine = MonitoringEngine(LineProfiler(sampler), lambda code: False)
        engine.start()
        engine.stop()
        assert all(sys.monitoring.get_tool(i) != "gpu_mem_track" for i in range(6))


def test_best_engine_picks_by_python_and_refuses_unknown_names():
    sink = LineProfiler(FakeSampler())
    expected = "sys.monitoring" if sys.version_info >= (3, 12) else "sys.settrace"
    assert best_engine(sink, lambda code: True).name == expected
    with pytest.raises(ValueError, match="unknown tracing engine"):
        best_engine(sink, lambda code: True, "dtrace")
    if sys.version_info < (3, 12):
        with pytest.raises(ValueError, match="needs Python 3.12"):
            best_engine(sink, lambda code: True, "monitoring")


def test_profiler_keeps_one_aggregate_per_line_however_long_the_loop():
    sampler = FakeSampler()
    timeline = engine_workload.ListTimeline()
    profiler = LineProfiler(sampler, timeline)

    def loop():
        for _ in range(5000):
            sampler.allocate(1)
            sampler.free(1)

    first = loop.__code__.co_firstlineno
    run_traced(profiler, loop)
    profiler.finish()
    assert len(profiler._stats) == 3  # the for line and the two body lines
    assert len(timeline.rows) == 3 * 5000 + 1  # each execution streamed, none kept
    function = loop.__qualname__ if sys.version_info >= (3, 11) else loop.__name__  # co_qualname: 3.11+
    assert timeline.rows[0].split(",")[2:6] == ["line", __file__, function, str(first + 1)]
    assert {r.hits for r in profiler.records()} == {5001, 5000}


def test_threshold_calls_back_with_the_line_that_grew():
    sampler = FakeSampler()
    grown: list[tuple[str, int, int]] = []

    def census(code, line, increment):
        grown.append((code.co_name, line, increment))
        sampler.allocate(1000)  # what the census itself costs must not land on the next line

    profiler = LineProfiler(sampler, None, census, 64)

    def work():
        sampler.allocate(10)
        sampler.allocate(100)
        sampler.allocate(1)

    run_traced(profiler, work)
    first = work.__code__.co_firstlineno
    assert grown == [("work", first + 2, 100)]
    assert {r.line: r.increment for r in profiler.records()}[first + 3] == 1
