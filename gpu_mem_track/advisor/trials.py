"""Running trials: one simulated run of the unmodified script with some levers, at some
batch, in its own run folder.

``SubprocessRunner`` runs ``python -m gpu_mem_track run --simulate GPU --lever ...``
in a child process (forked from a server that imported torch once: ``forked``; its
output goes to ``<folder>.log``) and reads the run folder's
``meta.json`` into a ``Trial``; ``read_trial`` is that reader alone. ``TrialPool`` is
what the advisor calls: it runs trials through any runner (a ``Callable[[TrialSpec],
Trial]``, so tests inject a fake one), at most ``jobs`` at a time, remembers each
(levers, batch) so no trial runs twice, and reports each start and end to ``progress``;
``TrialPool.stop`` (fit interrupted) cancels the trials not started, ends the running
ones (the runner's ``stop``) and refuses new ones.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..outputs import claim_folder
from ..units import format_bytes
from .forked import Stopped, run_forked, stop_all
from .records import LeverNote, OutOfMemory, Trial

__all__ = [
    "Stopped",
    "SubprocessRunner",
    "TrialPool",
    "TrialSpec",
    "last_line",
    "raised_in",
    "read_trial",
    "session_folder",
    "trial_name",
]

Runner = Callable[["TrialSpec"], Trial]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class TrialSpec:
    """What one trial runs: ``levers`` (names, in order) and ``batch`` (None: the
    script's arguments as given)."""

    levers: tuple[str, ...]
    batch: int | None = None

    @property
    def name(self) -> str:
        """The run folder's name: ``baseline``, ``expandable``, ``fused_checkpoint``,
        with ``-b48`` for batch 48 (letters, digits, ``_`` and ``-``: the runner keeps it
        as it is)."""
        return trial_name(self.levers, self.batch)


def trial_name(levers: Sequence[str], batch: int | None) -> str:
    """See ``TrialSpec.name``."""
    base = "_".join(levers) if levers else "baseline"  # no lever's name holds a "_"
    return base if batch is None else f"{base}-b{batch}"


def read_trial(
    folder: Path, levers: tuple[str, ...], batch: int | None, exit_code: int | None = None
) -> Trial:
    """The ``Trial`` in run folder ``folder`` (its ``meta.json``, read by
    ``runfolder.files.read_meta``); a folder without a readable one is a failed trial
    whose ``error`` says so (``exit_code`` is then the child's)."""
    from ..runfolder.files import read_meta
    from ..runfolder.simtext import compiled_note

    try:
        info = read_meta(folder / "meta.json")
    except BadInput as exc:
        return Trial(levers, batch, str(folder), exit_code, error=f"no run description: {exc}")
    simulation = info.simulation
    gpu = simulation.gpu if simulation is not None else {}
    non_pytorch = gpu.get("context_bytes", 0) + int(gpu.get("library_bytes") or 0)
    oom = _oom(simulation.out_of_memory if simulation is not None else None)
    code = info.exit_code
    return Trial(
        levers=levers,
        batch=batch,
        folder=str(folder),
        exit_code=code,
        peak=info.peak,
        reserved_peak=info.reserved_peak,
        peak_at=info.peak_at,
        oom=oom,
        capacity=oom.capacity if oom is not None else max(gpu.get("total_memory", 0) - non_pytorch, 0),
        notes=tuple(LeverNote.from_dict(n) for n in info.levers),
        error="" if code == 0 or oom is not None else f"the script exited with {code}",
        stopped=info.stopped.reason if info.stopped is not None else "",
        compiled=compiled_note(simulation) if simulation is not None else "",
    )


def _oom(data: dict[str, Any] | None) -> OutOfMemory | None:
    """The simulation's out-of-memory record (its keys checked by ``read_meta``)."""
    if data is None:
        return None
    return OutOfMemory(
        at=f"{data['filename']}:{data['line']}",
        request=data["request"],
        allocated=data["allocated"],
        reserved=data["reserved"],
        capacity=data["capacity"],
    )


@dataclass(frozen=True)
class SubprocessRunner:
    """Runs a trial as ``python -m gpu_mem_track run --simulate gpu --out-dir folder
    --run-name NAME [run_options] [--lever L ...] -- script args`` with the batch set
    by ``batch_arg`` (an object with ``with_batch(args, batch)``), in the current
    folder and environment (a fork of ``forked``'s server, else a new interpreter); its
    output goes to ``folder/NAME.log``."""

    script: str
    args: tuple[str, ...]
    gpu: str
    folder: Path
    run_options: tuple[str, ...] = ()
    batch_arg: Any = None

    def command(self, spec: TrialSpec) -> list[str]:
        """The child's command line for ``spec``."""
        args = self.args if spec.batch is None else self.batch_arg.with_batch(self.args, spec.batch)
        levers = [token for name in spec.levers for token in ("--lever", name)]
        return [
            sys.executable,
            "-m",
            "gpu_mem_track",
            "run",
            "--simulate",
            self.gpu,
            "--out-dir",
            str(self.folder),
            "--run-name",
            spec.name,
            *self.run_options,
            *levers,
            "--",
            self.script,
            *args,
        ]

    def stop(self) -> None:
        """End every running trial and its fork server; no trial starts after it."""
        stop_all()

    def __call__(self, spec: TrialSpec) -> Trial:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / f"{spec.name}.log"
        code = run_forked(self.command(spec)[3:], Path.cwd(), log)  # after "python -m gpu_mem_track"
        trial = read_trial(self.folder / spec.name, spec.levers, spec.batch, code)
        if trial.error.startswith("no run description"):
            tail = last_line(self.folder / f"{spec.name}.log")
            return Trial(spec.levers, spec.batch, trial.folder, code, error=tail or trial.error)
        if trial.error:  # failed for another reason than memory: say which exception, where
            raised = raised_in(log, self.script)
            return replace(trial, error=raised) if raised else trial
        return trial


def last_line(path: Path) -> str:
    """The last non-empty line of a trial's log ("" when it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def raised_in(log: Path, script: str = "") -> str:
    """The exception a trial's script ended with, one line (``"AssertionError: msg
    (train.py:12)"``: the last traceback's exception line and the file and line of its
    innermost frame in ``script``, else of its innermost frame), from the trial's log;
    "" when the log holds no traceback or cannot be read."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return ""
    where, own, exception = "", "", ""
    mine = Path(script).name if script else None
    for line in lines[starts[-1] + 1 :]:
        frame = _FRAME.match(line)
        if frame:
            where = f"{Path(frame.group(1)).name}:{frame.group(2)}"
            own = where if Path(frame.group(1)).name == mine else own
        elif line and not line[0].isspace():
            exception = line.strip()
            break
    if not exception:
        return ""
    where = own or where
    return f"{exception} ({where})" if where else exception


_FRAME = re.compile(r'\s+File "([^"]+)", line (\d+)')


class TrialPool:
    """Runs trials through ``runner``, at most ``jobs`` at once, each (levers, batch)
    once: asking again for one that ran (or is running) returns its result."""

    def __init__(self, runner: Runner, jobs: int, progress: Progress | None = None) -> None:
        self.runner = runner
        self.progress = progress or (lambda line: None)
        self._executor = ThreadPoolExecutor(max_workers=max(1, jobs))
        self._futures: dict[TrialSpec, Future[Trial]] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._started: set[TrialSpec] = set()  # handed to the runner (``_run``)
        #: The trials that ended before any stop, in the order they ended.
        self.complete: list[Trial] = []

    @property
    def count(self) -> int:
        """How many distinct trials were started."""
        return len(self._futures)

    def submit(self, spec: TrialSpec) -> Future[Trial]:
        """The future of ``spec``'s trial (started now unless it was already)."""
        with self._lock:
            if spec not in self._futures:
                if self._stopped:
                    raise Stopped("fit was interrupted")
                self._futures[spec] = self._executor.submit(self._run, spec)
            return self._futures[spec]

    def run(self, spec: TrialSpec) -> Trial:
        """``spec``'s trial, run (or recalled) and waited for."""
        return self.submit(spec).result()

    def run_all(self, specs: Iterable[TrialSpec]) -> list[Trial]:
        """The trials of ``specs``, in parallel, in their order."""
        futures = [self.submit(spec) for spec in specs]
        return [future.result() for future in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def stop(self) -> tuple[list[TrialSpec], list[TrialSpec]]:
        """Refuse new trials, cancel those not started, end the running ones (the
        runner's ``stop()``, when it has one) and wait for their threads; returns the
        trials that were running (their folders are not complete) and those that never
        started (queued: no folder, no log)."""
        with self._lock:
            self._stopped = True
            pending = [spec for spec, future in self._futures.items() if not future.done()]
            running = [spec for spec in pending if spec in self._started]
        for spec in pending:
            self._futures[spec].cancel()
        stop = getattr(self.runner, "stop", None)
        if stop is not None:
            stop()
        self._executor.shutdown(wait=True, cancel_futures=True)
        return running, [spec for spec in pending if spec not in running]

    def _run(self, spec: TrialSpec) -> Trial:
        with self._lock:  # a stop either sees this trial started or it never starts
            if self._stopped:
                raise Stopped("fit was interrupted")
            self._started.add(spec)
        self.progress(f"trial {spec.name}: started")
        trial = self.runner(spec)
        with self._lock:
            if self._stopped:  # ended by the stop: its folder is not a complete trial
                raise Stopped("fit was interrupted")
            self.complete.append(trial)
        self.progress(f"trial {spec.name}: {describe(trial)}")
        return trial


def describe(trial: Trial) -> str:
    """One line of a trial's figures, for progress."""
    if trial.oom is not None:
        return f"out of memory at {trial.oom.at} (needs at least {format_bytes(trial.oom.shortfall)} more)"
    if not trial.completed:
        return f"failed ({trial.error or 'no result'})"
    return (
        f"peak {format_bytes(trial.peak)} allocated, {format_bytes(trial.reserved_peak)} reserved "
        f"of {format_bytes(trial.capacity)}"
    )


def session_folder(out_dir: Path, script: Path) -> Path:
    """A new folder for one fit's trials under ``out_dir``, created here:
    ``fit-<script>-<time>``, with ``-2``, ``-3``... when that exists. ``UsageError`` (one
    line) when ``out_dir`` cannot be written (a file, a read-only folder), before any
    trial starts."""
    from ..runner.checks import check_out_dir

    check_out_dir(out_dir, str(out_dir))  # names the file in the way, as run does
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return claim_folder(out_dir, f"fit-{script.stem}-{stamp}")
