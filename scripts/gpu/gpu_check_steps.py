"""The steps of scripts/gpu/gpu_check.py: one subprocess each, time-boxed, and what each leaves.

``Check`` holds the clock (a budget in seconds from the start), every step's ``Outcome``
and the figures read from them, per workload: ``real`` (the plain run's JSON, written by
scripts/gpu/gpu_check_wrap.py), ``snapshot`` (its snapshot replayed by the ``snapshot``
command), ``runner`` and ``simulated`` (the run folders' meta.json) and ``notes`` (the
steps that failed). A step is killed with its whole process group at its timeout or at
the deadline it is given; one that cannot start before its deadline is skipped, and said
so. Steps run in threads; each child gets ``PYTHONPATH`` = this checkout first.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gpu_check_report as report

ROOT = Path(__file__).resolve().parents[2]
WRAP = ROOT / "scripts" / "gpu" / "gpu_check_wrap.py"
#: Iterations left out of the medians (iteration 0 holds nanoGPT's evaluation and first calls).
WARMUP = 5


@dataclass
class Workload:
    """A training script: ``argv`` after the interpreter, run in ``cwd``; ``timed`` names its
    kind of loop when it is one of the two timed ones."""

    name: str
    argv: list[str]
    cwd: Path
    timed: str = ""


@dataclass
class Outcome:
    """How one step ended: ``status`` is ok, failed (exit N), timed out, could not start or skipped."""

    name: str
    status: str
    seconds: float = 0.0
    output: str = ""
    rc: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """The step for report.json: name, status, seconds and ``detail`` (see ``why``)."""
        return {"name": self.name, "status": self.status, "seconds": self.seconds, "detail": self.why[2:]}

    @property
    def why(self) -> str:
        """``": "`` and the last line of the output that names an error (else its last
        line; after a timeout, its last line as such), cut to 160 characters; ``""`` when it
        ended well or said nothing."""
        lines = [line.strip() for line in self.output.splitlines() if line.strip()]
        if self.ok or not lines:
            return ""
        if self.status.startswith("timed out"):
            return f": its last line was {lines[-1][:140]!r}"
        named = [line for line in lines if re.search(r"Error|error:|Exception|Killed", line)]
        return ": " + (named or lines)[-1][:160]


class Check:
    """The clock, the steps' outcomes and the figures read from them; steps run in threads."""

    def __init__(self, budget: float, tmp: Path) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.budget = budget
        self.tmp = tmp
        self.lock = threading.Lock()
        self.steps: list[Outcome] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {text}", flush=True)

    def note(self, workload: str, text: str) -> None:
        with self.lock:
            self.results.setdefault(workload, {}).setdefault("notes", []).append(text)

    def put(self, workload: str, key: str, value: Any) -> None:
        with self.lock:
            self.results.setdefault(workload, {})[key] = value

    def run(
        self,
        name: str,
        argv: list[str],
        cwd: Path,
        timeout: float,
        until: float | None = None,
        env: dict[str, str] | None = None,
    ) -> Outcome:
        """Run one step, killing its process group at ``timeout`` seconds or at ``until``
        (a monotonic time, default the budget's end); ``env``: variables set for it only."""
        left = min(until or self.deadline, self.deadline) - time.monotonic()
        if left < 3:
            outcome = Outcome(name, "skipped (out of time)")
        else:
            self.say(f"start {name}")
            outcome = self._spawn(name, argv, cwd, min(timeout, left), {**self.env, **(env or {})})
            self.say(f"{name}: {outcome.status} ({outcome.seconds:.1f} s)")
        with self.lock:
            self.steps.append(outcome)
        return outcome

    def _spawn(self, name: str, argv: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> Outcome:
        began = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, text=True, errors="replace",
            )  # fmt: skip
        except OSError as exc:
            return Outcome(name, f"could not start: {exc}")
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            return Outcome(name, f"timed out after {timeout:.0f} s", time.monotonic() - began, output)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        return Outcome(name, status, time.monotonic() - began, output, proc.returncode)

    def skip(self, name: str, why: str) -> None:
        self.say(f"skip {name}: {why}")
        with self.lock:
            self.steps.append(Outcome(name, f"skipped ({why})"))


def python() -> str:
    return sys.executable or "python3"


def simulate(check: Check, w: Workload, gpu: str, until: float) -> None:
    """``run --simulate``: the run folder's meta.json as ``simulated``."""
    argv = [python(), "-m", "gpu_mem_track", "run", "--simulate", gpu, "--out-dir", str(check.tmp / "runs")]
    outcome = check.run(
        f"{w.name} simulated", [*argv, "--run-name", f"{w.name}-sim", *w.argv], w.cwd, 180, until
    )
    meta = read_json(check.tmp / "runs" / f"{w.name}-sim" / "meta.json")
    if meta:
        check.put(w.name, "simulated", meta)
    if not outcome.ok:
        check.note(w.name, f"simulated run {outcome.status}{outcome.why}")


def under_runner(
    check: Check, w: Workload, label: str, until: float, env: dict[str, str] | None = None
) -> Outcome:
    """``run`` on the real GPU: the run folder's meta.json as ``runner`` (not for a run
    with ``env`` set, such as the dict-read timing run)."""
    argv = [python(), "-m", "gpu_mem_track", "run", "--out-dir", str(check.tmp / "runs")]
    outcome = check.run(
        f"{w.name} {label}", [*argv, "--run-name", f"{w.name}-{label}", *w.argv], w.cwd, 120, until, env
    )
    meta = read_json(check.tmp / "runs" / f"{w.name}-{label}" / "meta.json")
    if meta and env is None:
        check.put(w.name, "runner", meta)
    if not outcome.ok:
        check.note(w.name, f"runner {outcome.status}{outcome.why}")
    return outcome


def plainly(check: Check, w: Workload, label: str, snapshot: bool, until: float) -> Outcome:
    """The plain run through the wrapper; with ``snapshot``, its snapshot replayed by the
    ``snapshot`` command (its snapshot.json kept as ``snapshot``)."""
    figures, pickle = check.tmp / f"{w.name}-{label}.json", check.tmp / f"{w.name}.pickle"
    argv = [python(), str(WRAP), str(figures), str(pickle) if snapshot else "-", *w.argv]
    outcome = check.run(f"{w.name} {label}", argv, w.cwd, 120, until)
    real = read_json(figures)
    if real and snapshot:
        check.put(w.name, "real", real)
    if not outcome.ok:
        check.note(w.name, f"plain run {outcome.status}{outcome.why}")
    if snapshot and pickle.is_file():
        argv = [
            python(),
            "-m",
            "gpu_mem_track",
            "snapshot",
            "--out-dir",
            str(check.tmp / "snap"),
            "--name",
            w.name,
        ]
        replay = check.run(f"{w.name} snapshot replay", [*argv, str(pickle)], check.tmp, 90, until)
        summary = read_json(check.tmp / "snap" / w.name / "snapshot.json")
        if summary:
            keep = ("entries", "peak", "max_reserved", "segments_allocated", "check")
            check.put(w.name, "snapshot", {k: summary.get(k) for k in keep})
        if not replay.ok:
            check.note(w.name, f"snapshot replay {replay.status}{replay.why}")
        pickle.unlink(missing_ok=True)
    return outcome


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def in_parallel(tasks: list[Callable[[], Any]], workers: int) -> None:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in [pool.submit(task) for task in tasks]:
            future.result()


def timing_row(
    check: Check, w: Workload, plain: Outcome, runner: Outcome, dict_read: Outcome | None = None
) -> dict[str, Any]:
    """Median iteration times of the plain run, the run under ``run`` and (``dict_read``)
    under ``run`` with the native CUDA reader off (``GPU_MEM_TRACK_NATIVE=off``)."""
    plain_times, runner_times = report.iteration_times(plain.output), report.iteration_times(runner.output)
    dict_times = report.iteration_times(dict_read.output) if dict_read else []
    return {
        "dict_ms": report.median_after_warmup(dict_times, WARMUP),
        "dict_status": dict_read.status if dict_read else "not run",
        "workload": w.name,
        "kind": w.timed,
        "plain_ms": report.median_after_warmup(plain_times, WARMUP),
        "runner_ms": report.median_after_warmup(runner_times, WARMUP),
        "plain_n": max(len(plain_times) - WARMUP, 0),
        "runner_n": max(len(runner_times) - WARMUP, 0),
        "warmup": WARMUP,
        "plain_status": plain.status,
        "runner_status": runner.status,
    }


def pytest_step(check: Check, name: str, args: list[str], timeout: float, until: float) -> str:
    """Run pytest quietly; its summary line (or, when it was cut short, the outcomes its
    progress lines show) and the tests that failed."""
    outcome = check.run(
        name, [python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], ROOT, timeout, until
    )
    check.put("_logs", name, outcome.output)
    summary = report.pytest_summary(outcome.output) or report.pytest_progress(outcome.output)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", outcome.output, re.MULTILINE)
    return f"{summary} ({outcome.status})" + "".join(f"\n  - {name}" for name in failed)
