"""The GPU check's clock and its steps: one subprocess each, time-boxed, and what each leaves.

``Check`` holds the budget (seconds from the start), every step's ``Outcome`` and the
figures read from them (``put``/``note``, per workload). A step is given a deadline (a
monotonic time: the end of its part's slot, never past the budget's end); one that cannot
start three seconds before it is skipped, and says so. At its timeout a step's process is
sent SIGINT first (pytest then writes its summary and its JUnit XML, a training script its
traceback; ``interruptible_children``: even where this process was started with SIGINT
ignored), then after ``grace`` seconds its whole process group is killed. Steps that use
the GPU (``gpu=True``) wait for one of ``gpu_slots`` places, so the GPU's memory holds
every run at once; the others run as the caller's threads allow. After every step the
listeners are called (the report is rewritten then, so a check cut off from outside loses
only the step in flight). Each child gets ``PYTHONPATH`` = this checkout first. Nothing
here imports another script.
"""

from __future__ import annotations

import contextvars
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

ROOT = Path(__file__).resolve().parents[2]
#: Seconds between a step's SIGINT and the SIGKILL of its process group.
GRACE = 5.0
#: The part a step belongs to: set by the caller around a part, carried into ``in_parallel``'s threads.
PART: contextvars.ContextVar[str] = contextvars.ContextVar("part", default="")


@dataclass
class Outcome:
    """How one step ended: ``status`` is ok, failed (exit N), timed out, could not start or skipped."""

    name: str
    status: str
    seconds: float = 0.0
    output: str = ""
    rc: int | None = None
    part: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def skipped(self) -> bool:
        return self.status.startswith("skipped")

    def to_dict(self) -> dict[str, Any]:
        """The step for report.json: name, status, seconds and ``detail`` (see ``why``)."""
        return {
            "name": self.name,
            "part": self.part,
            "status": self.status,
            "seconds": self.seconds,
            "detail": self.why[2:],
        }

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

    def __init__(self, budget: float, tmp: Path, gpu_slots: int = 3) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.budget = budget
        self.tmp = tmp
        self.lock = threading.Lock()
        self.gpu = threading.BoundedSemaphore(max(1, gpu_slots))
        self.steps: list[Outcome] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.listeners: list[Callable[[], None]] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        interruptible_children()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def at(self, fraction: float) -> float:
        """The monotonic time ``fraction`` of the budget after the start."""
        return self.start + fraction * self.budget

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
        gpu: bool = False,
        grace: float = GRACE,
    ) -> Outcome:
        """Run one step, interrupting it at ``timeout`` seconds or at ``until`` (a
        monotonic time, default the budget's end); ``env``: variables set for it only;
        ``gpu``: it waits for a GPU place first (its wait counts against ``until``)."""
        end = min(until or self.deadline, self.deadline)
        if gpu:
            self.gpu.acquire()
        try:
            left = end - time.monotonic()
            if left < 3:
                outcome = Outcome(name, "skipped (out of time: its slot had ended)")
                self.say(f"skip {name}: out of time")
            else:
                self.say(f"start {name}")
                outcome = self._spawn(name, argv, cwd, min(timeout, left), {**self.env, **(env or {})}, grace)
                self.say(f"{name}: {outcome.status} ({outcome.seconds:.1f} s)")
        finally:
            if gpu:
                self.gpu.release()
        self._add(outcome)
        return outcome

    def _spawn(
        self, name: str, argv: list[str], cwd: Path, timeout: float, env: dict[str, str], grace: float
    ) -> Outcome:
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
            proc.send_signal(signal.SIGINT)  # the leader only: pytest's controller ends its workers
            try:
                output, _ = proc.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            else:
                _kill_group(proc.pid)  # what the leader left behind
            return Outcome(
                name, f"timed out after {timeout:.0f} s", time.monotonic() - began, output, proc.returncode
            )
        _kill_group(proc.pid)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        return Outcome(name, status, time.monotonic() - began, output, proc.returncode)

    def skip(self, name: str, why: str) -> None:
        self.say(f"skip {name}: {why}")
        self._add(Outcome(name, f"skipped ({why})"))

    def _add(self, outcome: Outcome) -> None:
        outcome.part = PART.get()
        with self.lock:
            self.steps.append(outcome)
        for listener in list(self.listeners):
            listener()


def interruptible_children() -> None:
    """Let the steps' processes take the SIGINT that cuts them: a command started in the
    background by a shell without job control (``nohup make gpu-check &``, a remote
    runner's shell) has SIGINT ignored, and an ignored signal stays ignored in every child
    (a Python child then installs no KeyboardInterrupt handler, and pytest is killed at the
    grace's end without its summary). Where it is ignored, this process takes Python's
    default handler instead, which ``exec`` resets to the default action in the children.
    From the main thread only (Python's rule for ``signal.signal``)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def python() -> str:
    return sys.executable or "python3"


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or ``None`` when it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def in_parallel(tasks: list[Callable[[], Any]], workers: int) -> None:
    """Run ``tasks`` on ``workers`` threads, in the order given, each in a copy of the
    caller's context (so its steps belong to the caller's part); the first exception is raised."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in [pool.submit(contextvars.copy_context().run, task) for task in tasks]:
            future.result()
