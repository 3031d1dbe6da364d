"""A torch-free workload for the tracing engines, runnable on any Python 3.9+.

``profile_workload(engine)`` runs ``workload`` under one engine with a ``FakeSampler``
and returns the per-line records (seconds left out) as plain dicts. Run as a script it
prints them as JSON, so a test on Python 3.11 can check the ``sys.monitoring`` engine in a
Python 3.12+ subprocess that has no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def spike(s, nbytes):
    s.allocate(nbytes)
    s.free(nbytes)


def inner(s):
    s.allocate(100)
    spike(s, 50)  # a transient peak inside one line
    return 1


def chunks(s):
    for _ in range(2):
        s.allocate(10)
        yield 1


def fails(s):
    s.allocate(7)
    raise ValueError("expected")


def touch(s, nbytes, again):
    s.allocate(nbytes)
    s.free(nbytes)
    return again


def spread(s):
    for _ in range(2):
        touch(
            s,
            1,
            touch(s, 2, 0),
        )


def workload(s):
    for _ in range(3):
        inner(s)
    spread(s)
    total = sum(chunks(s))
    try:
        fails(s)
    except ValueError:
        pass
    s.free(327)
    return total


def python312() -> str | None:
    """An interpreter with sys.monitoring: this one, or a python3.12/3.13 found nearby."""
    if sys.version_info >= (3, 12):
        return sys.executable
    home = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = ["python3.13", "python3.12", *sorted(str(p) for p in home.glob("3.1[23]*/bin/python3"))]
    for candidate in candidates:
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return candidate
    return None


class ListTimeline:
    """A timeline writer that keeps its rows in a list (as CSV text)."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def write_text(self, line: str) -> None:
        self.rows.append(line)

    def write(self, values: list) -> None:
        self.rows.append(",".join("" if v is None else str(v) for v in values) + "\n")


def profile_workload(engine: str) -> list[dict]:
    from gpu_mem_track.runner.profiler import LineProfiler
    from gpu_mem_track.runner.samplers import FakeSampler
    from gpu_mem_track.runner.tracer import best_engine

    sampler = FakeSampler()
    timeline = ListTimeline()
    profiler = LineProfiler(sampler, timeline)
    tracer = best_engine(profiler, lambda code: code.co_filename == __file__, engine)
    tracer.start()
    try:
        workload(sampler)
    finally:
        tracer.stop()
    profiler.finish()
    records = [r.to_dict() for r in profiler.records()]
    for record in records:
        del record["seconds"]
        record["file"] = "engine_workload.py"
    records.sort(key=lambda r: (r["line"], r["function"]))
    return records + [{"timeline_rows": len(timeline.rows), "peak": profiler.peak}]


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[2])
    print(json.dumps(profile_workload(sys.argv[1])))
