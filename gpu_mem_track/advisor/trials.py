"""Running trials: one simulated run of the unmodified script with some levers, at some
batch, in its own run folder.

``SubprocessRunner`` runs ``python -m gpu_mem_track run --simulate GPU --lever ...``
in a child process (forked from a server that imported torch once: ``forked``; its
output goes to ``<folder>.log``) and reads the run folder's
``meta.json`` into a ``Trial``; ``read_trial`` is that reader alone. ``TrialPool`` is
what the advisor calls: it runs trials through any runner (a ``Callable[[TrialSpec],
Trial]``, so tests inject a fake one), at most ``jobs`` at a time, remembers each
(levers, batch) so no trial runs twice, and reports each start and end to ``progress``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..units import format_bytes
from .forked import run_forked
from .records import LeverNote, OutOfMemory, Trial

__all__ = ["SubprocessRunner", "TrialPool", "TrialSpec", "read_trial", "trial_name"]

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
    """The ``Trial`` in run folder ``folder`` (its ``meta.json``); a folder without a
    readable one is a failed trial whose ``error`` says so (``exit_code`` is then the
    child's)."""
    from ..inputs import load_json

    meta = folder / "meta.json"
    try:
        data = load_json(meta, "a gpu_mem_track run description")
    except BadInput as exc:
        return Trial(levers, batch, str(folder), exit_code, error=f"no run description: {exc}")
    if not isinstance(data, dict):
        return Trial(levers, batch, str(folder), exit_code, error=f"{meta} is not a run description")
    simulation = data.get("simulation") or {}
    gpu = simulation.get("gpu") or {}
    capacity = (
        int(gpu.get("total_memory", 0)) - int(gpu.get("context_bytes", 0)) - int(gpu.get("library_bytes", 0))
    )
    oom = _oom(simulation.get("out_of_memory"))
    code, stopped = data.get("exit_code"), data.get("stopped")
    return Trial(
        levers=levers,
        batch=batch,
        folder=str(folder),
        exit_code=code,
        peak=data.get("peak"),
        reserved_peak=data.get("reserved_peak"),
        peak_at=str(data.get("peak_at") or ""),
        oom=oom,
        capacity=oom.capacity if oom is not None else max(capacity, 0),
        notes=tuple(LeverNote.from_dict(n) for n in data.get("levers") or () if isinstance(n, dict)),
        error="" if code == 0 or oom is not None else f"the script exited with {code}",
        stopped=str(stopped.get("reason", "")) if isinstance(stopped, dict) else "",
    )


def _oom(data: Any) -> OutOfMemory | None:
    if not isinstance(data, dict):
        return None
    return OutOfMemory(
        at=f"{data.get('filename', '?')}:{data.get('line', '?')}",
        request=int(data.get("request", 0)),
        allocated=int(data.get("allocated", 0)),
        reserved=int(data.get("reserved", 0)),
        capacity=int(data.get("capacity", 0)),
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

    def __call__(self, spec: TrialSpec) -> Trial:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / f"{spec.name}.log"
        code = run_forked(self.command(spec)[3:], Path.cwd(), log)  # after "python -m gpu_mem_track"
        trial = read_trial(self.folder / spec.name, spec.levers, spec.batch, code)
        if trial.error.startswith("no run description"):
            tail = _last_line(self.folder / f"{spec.name}.log")
            return Trial(spec.levers, spec.batch, trial.folder, code, error=tail or trial.error)
        return trial


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


class TrialPool:
    """Runs trials through ``runner``, at most ``jobs`` at once, each (levers, batch)
    once: asking again for one that ran (or is running) returns its result."""

    def __init__(self, runner: Runner, jobs: int, progress: Progress | None = None) -> None:
        self.runner = runner
        self.progress = progress or (lambda line: None)
        self._executor = ThreadPoolExecutor(max_workers=max(1, jobs))
        self._futures: dict[TrialSpec, Future[Trial]] = {}
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """How many distinct trials were started."""
        return len(self._futures)

    def submit(self, spec: TrialSpec) -> Future[Trial]:
        """The future of ``spec``'s trial (started now unless it was already)."""
        with self._lock:
            if spec not in self._futures:
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

    def _run(self, spec: TrialSpec) -> Trial:
        self.progress(f"trial {spec.name}: started")
        trial = self.runner(spec)
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
