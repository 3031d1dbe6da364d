"""The stop rule's tests' harness: a script's ``main(argument)`` run for real under a
tracing engine that feeds a ``LoopWatch`` (test_steady, test_steady_leave,
test_steady_gpu_work), and the command line run in a subprocess."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpu_mem_track.runner.loops import pad_loops
from gpu_mem_track.runner.steady import LoopWatch, StopRun
from gpu_mem_track.runner.tracer import SettraceEngine

ROOT = Path(__file__).resolve().parents[1]


class Sink:
    """Records the lines the watch forwards, and how deep in calls it is."""

    def __init__(self) -> None:
        self.lines: list[int] = []
        self.depth = 0

    def enter(self, code):
        self.depth += 1

    def line(self, code, lineno):
        self.lines.append(lineno)

    def leave(self, code):
        self.depth -= 1


def run_main(
    tmp_path: Path, source: str, watch: LoopWatch, argument: object, engine=SettraceEngine, pad: bool = False
) -> tuple[dict, bool]:
    """Write ``source`` (dedented) to ``tmp_path/script.py``, compile it (``pad``: as the
    runner does, ``loops.pad_loops``) and call its ``main(argument)`` with ``engine``
    tracing that file alone into ``watch``. Returns (the script's namespace, whether
    ``StopRun`` ended it)."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(source))
    namespace: dict = {"__name__": "script"}
    tree = ast.parse(path.read_text())
    exec(compile(pad_loops(tree) if pad else tree, str(path), "exec"), namespace)
    tracer = engine(watch, lambda c: c.co_filename == str(path))
    tracer.start()
    ended = False
    try:
        namespace["main"](argument)
    except StopRun:
        ended = True
    finally:
        tracer.stop()
    return namespace, ended


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m gpu_mem_track *args`` in a subprocess in ``cwd``, this checkout first on
    its path: its exit code and text output."""
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
