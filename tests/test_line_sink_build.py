"""The native line sink is built on first use, in the background, and a run says which path
it used.

A run that finds the module missing starts its build (``native.linesink.request_build``:
a process of its own) and traces through Python; a run after the build has ended uses the
module. The build is injected here (``start_build``, ``_load``) except in the slow test,
which builds for real into a temporary cache. The build cache is shared by concurrent
processes: one compile per key (a lock file), the module moved into place in one rename,
and a key of its own for each torch build.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpu_mem_track.native import build, linesink
from gpu_mem_track.runfolder.files import read_meta
from gpu_mem_track.runfolder.records import RunInfo
from gpu_mem_track.runfolder.render import paths_line, render_summary
from gpu_mem_track.runner.profiler import LineProfiler
from gpu_mem_track.runner.run import RunOptions, execute, prepare
from gpu_mem_track.runner.samplers import FakeSampler


class Build:
    """A background build standing in for the real one: running until ``done``."""

    done = False

    def poll(self) -> int | None:
        return 0 if self.done else None


class FakeCore:
    """What ``line_sink.Core`` gives the profiler: its three callbacks (Python's, here)."""

    def __init__(self, profiler, python_line, native_reads, *monitoring) -> None:
        self.line = python_line
        self.enter = lambda code: LineProfiler.enter(profiler, code)
        self.leave = lambda code: LineProfiler.leave(profiler, code)


class FakeModule:
    Core = FakeCore


@pytest.fixture
def fresh(monkeypatch):
    """A fresh line sink state in ``auto`` mode, with the build injected: ``started`` lists
    the builds started, ``builder`` is the one handed out, the module loads once it is done."""
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    monkeypatch.setattr(linesink, "_state", linesink._fresh_state())
    builder = Build()
    started: list[str] = []
    monkeypatch.setattr(linesink, "start_build", lambda name: started.append(name) or builder)
    monkeypatch.setattr(
        linesink,
        "_load",
        lambda: (
            (FakeModule, "in use: loaded from here") if builder.done else (None, "not built (make native)")
        ),
    )
    return started, builder


def test_a_missing_sink_is_built_in_the_background_and_used_by_the_runs_after_it(fresh):
    started, builder = fresh
    first = LineProfiler(FakeSampler())
    assert (first.native, first.native_note, started) == (
        False,
        "being built in the background",
        ["line_sink"],
    )
    during = LineProfiler(FakeSampler())  # a run while it is being built: Python, no second build
    assert (during.native, started) == (False, ["line_sink"])
    builder.done = True
    after = LineProfiler(FakeSampler())
    assert (after.native, after.native_note, started) == (True, "in use: loaded from here", ["line_sink"])


def test_no_build_is_started_when_it_is_off(fresh, monkeypatch):
    started, _ = fresh
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "off")
    profiler = LineProfiler(FakeSampler())
    assert (profiler.native, profiler.native_note, started) == (False, "off (GPU_MEM_TRACK_NATIVE=off)", [])


def test_where_it_cannot_be_built_the_run_says_why_and_starts_nothing(monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    monkeypatch.setattr(linesink, "_state", linesink._fresh_state())
    monkeypatch.setattr(linesink, "start_build", lambda name: None)  # as start_build does without a compiler
    monkeypatch.setattr(linesink, "_load", lambda: (None, "not built: no C++ compiler found"))
    profiler = LineProfiler(FakeSampler())
    assert (profiler.native, profiler.native_note) == (False, "not built: no C++ compiler found")


def test_a_sink_given_to_the_profiler_is_not_looked_for(monkeypatch):
    monkeypatch.setattr(linesink, "for_run", lambda: pytest.fail("looked for the module"))
    assert LineProfiler(FakeSampler(), line_sink=None).native_note == "not given"
    assert LineProfiler(FakeSampler(), line_sink=FakeModule).native is True


def test_start_build_starts_nothing_where_the_module_cannot_be_built(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert build.plan(name=build.LINE_MODULE).missing.startswith("no C++ compiler")
    assert linesink.start_build("line_sink") is None


def test_another_process_holding_the_lock_keeps_the_python_path(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(linesink, "_state", linesink._fresh_state())
    assert not linesink.building()
    linesink._state["builder"] = Build()
    linesink._state["builder"].done = True  # ours ended at once: it found the lock taken
    lock = build.plan(name=build.LINE_MODULE).folder / ".lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("12345")
    assert linesink.building()
    os.utime(lock, (0, 0))  # a lock older than STALE_LOCK_SECONDS: a build that died
    assert not linesink.building()


# -- the run says which path it used ----------------------------------------------------------


def _run(tmp_path: Path) -> tuple[Path, str]:
    script = tmp_path / "script.py"
    script.write_text("x = 1\ny = x + 1\n")
    # settrace: the fake module's Core has no sys.monitoring callbacks
    options = RunOptions(
        str(script), out_dir=str(tmp_path / "out"), run_name="r", device="cpu", engine="settrace"
    )
    summary = io.StringIO()
    result = execute(prepare(options), summary, sampler=FakeSampler())
    assert result.exit_code == 0
    return result.folder, summary.getvalue()


def test_a_run_says_it_used_python_while_the_sink_is_being_built(tmp_path, fresh):
    folder, summary = _run(tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["line_sink"], meta["line_sink_note"], meta["stats_reader"]) == (
        "python",
        "being built in the background",
        "",
    )
    assert (
        "Line sink: Python (the native one is being built in the background; the next runs use it)\n"
        in summary
    )
    assert read_meta(folder / "meta.json").line_sink == "python"


def test_a_run_says_it_used_the_native_sink(tmp_path, fresh):
    _, builder = fresh
    builder.done = True
    folder, summary = _run(tmp_path)
    info = read_meta(folder / "meta.json")
    assert (info.line_sink, info.line_sink_note) == ("native", "in use: loaded from here")
    assert "\nLine sink: native\n" in summary


def test_a_run_with_native_off_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "off")
    monkeypatch.setattr(linesink, "_state", linesink._fresh_state())
    folder, summary = _run(tmp_path)
    assert read_meta(folder / "meta.json").line_sink_note == "off (GPU_MEM_TRACK_NATIVE=off)"
    assert "Line sink: Python (off (GPU_MEM_TRACK_NATIVE=off))" in summary


def test_the_paths_line_names_the_cuda_statistics_read_and_old_runs_say_nothing(tmp_path):
    info = RunInfo("r", "s.py", (), "cuda:0", "cuda allocator", "sys.monitoring", 0.0, "3.12", "", "")
    assert "Line sink" not in render_summary(info, [], tmp_path)  # a meta.json written before
    native = RunInfo(**{**info.__dict__, "line_sink": "native", "stats_reader": "native"})
    assert paths_line(native) == "Line sink: native | CUDA statistics: native reader"
    python = RunInfo(
        **{**info.__dict__, "line_sink": "python", "line_sink_note": "x", "stats_reader": "dict"}
    )
    assert paths_line(python) == "Line sink: Python (x) | CUDA statistics: torch's dict"


# -- the build cache: concurrent processes and torch builds ----------------------------------


def _fake_compiler(tmp_path: Path, seconds: float) -> Path:
    """A 'compiler' that logs each call, waits, then writes the file after ``-o``."""
    log = tmp_path / "calls.log"
    compiler = tmp_path / "fake-cxx"
    compiler.write_text(
        "#!/bin/sh\n"
        f'echo "$$" >> "{log}"\n'
        f"sleep {seconds}\n"
        'while [ "$#" -gt 0 ]; do if [ "$1" = "-o" ]; then shift; echo built > "$1"; fi; shift; done\n'
    )
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    return compiler


def test_concurrent_builds_of_one_key_compile_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, 0.5)))
    root = tmp_path / "cache"
    results: list[build.BuildPlan] = []
    threads = [
        threading.Thread(target=lambda: results.append(build.build(root, name=build.LINE_MODULE)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    target = build.plan(root, build.LINE_MODULE)
    assert target.built and target.module.read_text() == "built\n"
    assert len((tmp_path / "calls.log").read_text().split()) == 1  # one compile for four builds
    assert not (target.folder / ".lock").exists()
    assert not list(target.folder.glob(".*.tmp"))  # the partial file was renamed into place
    assert build.build(root, name=build.LINE_MODULE).built  # a later build finds it built
    assert len((tmp_path / "calls.log").read_text().split()) == 1


def test_each_torch_build_has_its_own_key(tmp_path, monkeypatch):
    here = build.plan(tmp_path, build.LINE_MODULE)
    facts = build._torch_facts()
    monkeypatch.setattr(build, "_torch_facts", lambda: ("9.9.9", *facts[1:]))
    other = build.plan(tmp_path, build.LINE_MODULE)
    assert other.folder != here.folder and other.torch_version == "9.9.9"
    census = build.plan(tmp_path, build.MODULE)
    assert census.folder != other.folder


@pytest.mark.slow
def test_the_real_background_build_ends_with_a_module_the_next_run_uses(tmp_path, monkeypatch):
    """start_build's process (``--background``) compiles line_sink.cpp into the cache; a
    profiler made after it has ended runs natively."""
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    monkeypatch.setattr(linesink, "_state", linesink._fresh_state())
    target = build.plan(name=build.LINE_MODULE)
    if target.missing:
        pytest.skip(f"cannot build the line sink here: {target.missing}")
    first = LineProfiler(FakeSampler())
    assert (first.native, first.native_note) == (False, "being built in the background")
    builder = linesink._state["builder"]
    assert isinstance(builder, subprocess.Popen)
    assert builder.wait(timeout=600) == 0, (target.folder / "build.log").read_text()
    deadline = time.monotonic() + 5
    while linesink.building() and time.monotonic() < deadline:  # the lock is gone with it
        time.sleep(0.05)
    after = LineProfiler(FakeSampler())
    assert after.native, after.native_note
    assert after.native_note == f"in use: loaded from {target.module}"


def test_a_build_another_process_holds_at_start_is_waited_for_not_started_again(tmp_path, monkeypatch):
    """A run starting while another process (a rank, another run) builds the module starts
    no build process of its own; its builder follows the other's lock."""
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    monkeypatch.setattr(linesink, "_state", linesink._fresh_state())
    target = build.plan(name=build.LINE_MODULE)
    if target.missing:
        pytest.skip(f"cannot build the line sink here: {target.missing}")
    lock = target.folder / ".lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("12345")
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("started a second build"))
    profiler = LineProfiler(FakeSampler())
    assert (profiler.native, profiler.native_note) == (False, "being built in the background")
    assert linesink.building()
    lock.unlink()  # the other build ended (here: without a module)
    assert not linesink.building()
    assert linesink.module() is None and linesink.status().startswith("not built")
