"""The check scripts' simulated runs: ``python -m gpu_mem_track run ...`` of this
checkout in a subprocess, timed, stopping the check with the run's output when it fails."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_simulated(
    args: list[str], cwd: Path, timeout: float, what: str = "the simulated run", tail: int | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m gpu_mem_track run *args`` in ``cwd``, this checkout first on
    ``PYTHONPATH``, killed after ``timeout`` seconds: the finished process and the seconds
    it took. A run that fails ends the check (``SystemExit``): "``what`` failed (its exit
    code):" then its stdout and stderr, or only the last ``tail`` characters of its stderr
    when ``tail`` is given (a training script's long log)."""
    command = [sys.executable, "-m", "gpu_mem_track", "run", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        output = f"{done.stdout}\n{done.stderr}" if tail is None else done.stderr[-tail:]
        raise SystemExit(f"{what} failed ({done.returncode}):\n{output}")
    return done, seconds
