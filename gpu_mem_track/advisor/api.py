"""``fit(script, ...)``: what would make a script fit on a simulated GPU.

The order of trials (each a simulated run of the unmodified script, ``trials``): the
script as it is first. When it fails for a reason other than memory, nothing else is
tried. When it fits (completed, peak reserved at most ``threshold`` of the capacity),
that is the answer. Otherwise each lever runs alone (in parallel), then, when none fits
alone, the cheapest combination (``plan.cheapest_combination``). With a batch argument
the largest batch that fits is searched for the script as it is and for every row whose
levers applied (``batch.find_batch``; the searches run side by side, each started as soon
as its row's trial is known, their trials share the pool, and the trial at the user's
batch is reused). Every "fits" is a trial that ran.

When nothing fits at the user's batch but some row fits a smaller one, the answer is
that row (the largest batch; on a tie the cheapest: ``best_smaller``), verdict
``"smaller"``, with how to keep the batch asked for by gradient accumulation where the
script has an argument for it (``accumulation``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from dataclasses import replace
from pathlib import Path

from ..errors import UsageError
from ..levers.allocator import NOT_TRIED
from .accumulation import accumulation
from .batch import BatchArg, check_max_batch, find_batch
from .plan import cheapest_combination, label, make_row, parse_levers, rank
from .records import Accumulation, BatchAnswer, FitResult, FitRow, LeverNote, Trial
from .trials import Stopped, SubprocessRunner, TrialPool, TrialSpec, session_folder

__all__ = [
    "FitInterrupted",
    "best_smaller",
    "check_trial_options",
    "default_jobs",
    "fit",
    "trial_run_options",
]


class FitInterrupted(KeyboardInterrupt):
    """``fit`` interrupted (Ctrl-C; SIGTERM or SIGHUP where the caller turns them into a
    ``KeyboardInterrupt`` with a ``signum``): every trial was ended and no process of its
    is left. ``folder``: the session folder; ``complete``: the run folders of the trials
    that ended before (complete reports); ``stopped``: the names of the trials ended while
    running (their folders are not complete); ``not_started``: those still waiting for a
    slot (no folder, no log); ``signum``: the signal (``signal.SIGINT`` for Ctrl-C)."""

    def __init__(
        self,
        folder: str,
        complete: list[str],
        stopped: list[str],
        signum: int,
        not_started: list[str] | None = None,
    ) -> None:
        super().__init__(f"fit interrupted by signal {signum}")
        self.folder, self.complete, self.stopped, self.signum = folder, complete, stopped, signum
        self.not_started = not_started or []

    @classmethod
    def stopping(cls, pool: TrialPool, folder: Path, interrupt: KeyboardInterrupt) -> FitInterrupted:
        """Stop every trial of ``pool`` (``TrialPool.stop``) and say what ``interrupt``
        (Ctrl-C, or SIGTERM/SIGHUP turned into one, with its ``signum``) left."""
        import signal

        running, waiting = pool.stop()
        complete = [trial.folder for trial in pool.complete]
        signum = getattr(interrupt, "signum", signal.SIGINT)
        return cls(str(folder), complete, [s.name for s in running], signum, [s.name for s in waiting])


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def fit(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    gpu: str,
    levers: str | Sequence[str] | None = None,
    batch_arg: str | int | None = None,
    threshold: float = 0.9,
    jobs: int | None = None,
    out_dir: str | os.PathLike[str] = "reports",
    max_batch: int | None = None,
    include: Sequence[str] = (),
    max_iterations: int | None = None,
    max_seconds: float | None = None,
    run_to_end: bool = False,
    end_script: bool = False,
    engine: str = "auto",
    runner: Callable[[TrialSpec], Trial] | None = None,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """What would make ``script`` (run with ``args``) fit on the simulated GPU ``gpu``.

    ``gpu``: a name the ``gpus`` command lists, or ``SIZE:smXY``. ``levers``: the levers
    to try (``"a,b"`` or names; None: all of ``plan.LEVERS``). ``batch_arg``: where
    ``args`` set the batch (``"--batch_size"`` for ``--batch_size=32`` or
    ``--batch_size 32``, or an index into ``args``); with it every row also gets the
    largest batch that fits, at most ``max_batch`` (default: no limit). ``threshold``:
    the fraction of the capacity (bytes the allocator may reserve: total memory less the
    CUDA context and libraries) above which a completed run's peak reserved counts as
    too tight, so levers are tried. ``jobs``: trials run at once (None: the cores
    available). Trial run folders go under ``out_dir/fit-<script>-<date>-<time>/``, one
    per trial (``baseline``, ``checkpoint``, ``expandable_checkpoint-b48``, ...), each a
    full ``run`` report. ``include``, ``max_iterations``, ``max_seconds``,
    ``run_to_end``, ``end_script`` and ``engine`` are passed to every trial as ``run``'s
    options of those names. ``runner(spec)`` replaces the child process that runs a
    trial (for tests); ``progress(line)`` is told of each trial started and finished.
    Returns a :class:`~gpu_mem_track.advisor.records.FitResult` (``.rows``, ``.to_dict()``,
    ``.exit_code``). ``UsageError`` for a bad GPU name, a missing script, a batch
    argument the args do not hold, or a bad option.
    """
    started = time.monotonic()
    from ..simgpu.catalog import parse_gpu

    spec = parse_gpu(gpu)
    chosen = parse_levers(levers)
    if not 0 < threshold <= 1:
        raise UsageError(f"--threshold takes a fraction in (0, 1], not {threshold}")
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs takes a count >= 1, not {jobs}")
    check_trial_options(script, include, max_iterations, max_seconds, engine)
    args = tuple(str(a) for a in args)
    where = BatchArg.parse(batch_arg) if batch_arg is not None else None
    user_batch = where.value(args) if where is not None else None
    check_max_batch(max_batch, user_batch)
    folder = session_folder(Path(out_dir), Path(script))
    options = trial_run_options(include, max_iterations, max_seconds, run_to_end, end_script, engine)
    if runner is None:
        from .forked import preload_script_imports, resume

        resume()  # a fit before in this process may have been interrupted
        preload_script_imports(script)
        runner = SubprocessRunner(str(script), args, gpu, folder, options, where)
    say = progress or (lambda line: None)
    pool = TrialPool(runner, jobs, say)
    try:
        baseline = pool.run(TrialSpec(()))
        searches = None
        if where is not None and baseline.fits(threshold) != "failed":
            searches = _Searches(pool, user_batch, baseline.capacity, max_batch, say)
            searches.start(())
        verdict, rows, recommended, not_applied = _advise(
            pool, baseline, chosen, threshold, jobs, say, searches
        )
        if searches is not None:
            rows = searches.finish(rows)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP turned into one by the caller
        raise FitInterrupted.stopping(pool, folder, exc) from None
    finally:
        pool.close()
    keep: Accumulation | None = None
    best = best_smaller(rows) if verdict == "none" and user_batch is not None else None
    if best is not None and best.batch is not None and user_batch is not None:
        verdict, recommended = "smaller", best.label
        keep = accumulation(_text(script), args, user_batch, best.batch.batch)
    capacity = baseline.capacity or spec.capacity  # what the trials saw
    return FitResult(
        script=str(script),
        args=args,
        gpu=spec.name,
        total_memory=spec.total_memory,
        capacity=capacity,
        threshold=threshold,
        verdict=verdict,
        rows=tuple(rows),
        recommended=recommended,
        not_applied=tuple(not_applied),
        folder=str(folder),
        trials=pool.count,
        seconds=round(time.monotonic() - started, 1),
        batch_arg=None if where is None else str(batch_arg),
        batch=user_batch,
        accumulation=keep,
        compiled=baseline.compiled,
    )


def best_smaller(rows: Sequence[FitRow]) -> FitRow | None:
    """The row whose largest batch that fits is the largest (on a tie the cheapest,
    ``plan.rank``); None when no row fits any batch."""
    found = [row for row in rows if row.batch is not None and row.batch.batch >= 1]
    if not found:
        return None
    return min(found, key=lambda row: (-row.batch.batch if row.batch else 0, rank(row.levers)))


def _text(script: str | os.PathLike[str]) -> str:
    """The script's text ("" when it cannot be read: a folder's ``__main__.py`` is read)."""
    path = Path(script)
    if path.is_dir():
        path = path / "__main__.py"
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _advise(
    pool: TrialPool,
    baseline: Trial,
    chosen: tuple[str, ...],
    threshold: float,
    jobs: int,
    say: Callable[[str], None],
    searches: _Searches | None,
) -> tuple[str, list[FitRow], str | None, list[tuple[str, str]]]:
    """(verdict, rows, recommended label, levers not applied with why); the batch
    ``searches`` of the levers that applied start before the combination runs."""
    first = make_row(baseline, threshold)
    if first.fits in ("failed", "yes"):
        return ("fits" if first.fits == "yes" else "failed"), [first], None, []
    say(f"as it is: {'too tight' if first.fits == 'tight' else 'out of memory'}; trying {', '.join(chosen)}")
    singles = pool.run_all(TrialSpec((name,)) for name in chosen if name not in NOT_TRIED)
    why: dict[str, str] = {name: NOT_TRIED[name] for name in chosen if name in NOT_TRIED}
    tried: list[Trial] = []
    for trial in singles:
        note = next((n for n in trial.notes if n.name == trial.levers[0]), None)
        if note is not None and not note.applied:
            why[note.name] = _why_not(note, trial)
        else:
            tried.append(trial)
            if searches is not None and trial.fits(threshold) != "failed":
                searches.start(trial.levers)
    if not any(t.fits(threshold) == "yes" for t in tried):
        applied = [t.levers[0] for t in tried if t.fits(threshold) != "failed"]
        if len(applied) >= 2:
            say(f"no lever fits alone; combining {' + '.join(applied)}")
            combos, _ = cheapest_combination(pool, applied, threshold, jobs)
            tried.extend(combos)
    rows = [first, *(make_row(t, threshold) for t in tried)]
    verdict, recommended = _verdict(rows)
    return verdict, rows, recommended, [(name, why[name]) for name in chosen if name in why]


def _why_not(note: LeverNote, trial: Trial) -> str:
    """Why a lever did not apply; when the script never reached what it changes because
    its trial ran out of memory first, that is said too (the lever may apply to a run that
    gets further, but is not tried in combinations)."""
    reason = note.reason or "not applied"
    if trial.oom is not None and not note.reached:
        reason += f" (its trial ran out of memory at {trial.oom.at} first; not tried in combinations)"
    return reason


def _verdict(rows: list[FitRow]) -> tuple[str, str | None]:
    """(verdict, recommended label) from the rows (the first is the script as it is)."""
    changes = sorted(rows[1:], key=lambda r: rank(r.levers))
    for wanted in ("yes", "tight"):
        found = next((r for r in changes if r.fits == wanted), None)
        if found is not None and (wanted == "yes" or rows[0].fits != "tight"):
            return "found", found.label
    return ("tight", None) if rows[0].fits == "tight" else ("none", None)


class _Searches:
    """The batch searches, each in its own thread, started as soon as its row's trial is
    known (the script as it is: while the levers run; each lever: while the combination
    runs), so the pool's workers are not left idle; their trials share the pool."""

    def __init__(
        self, pool: TrialPool, batch: int, capacity: int, max_batch: int | None, say: Callable[[str], None]
    ) -> None:
        self.pool, self.batch, self.capacity, self.say = pool, batch, capacity, say
        self.max_batch = max_batch or 1 << 20
        self.answers: dict[tuple[str, ...], BatchAnswer] = {}
        self.threads: dict[tuple[str, ...], threading.Thread] = {}

    def start(self, levers: tuple[str, ...]) -> None:
        """Start the search for ``levers`` (once)."""
        if levers not in self.threads:
            self.say(f"batch search from batch {self.batch}: {label(levers)}")
            thread = threading.Thread(target=self._search, args=(levers,), daemon=True)
            self.threads[levers] = thread
            thread.start()

    def _search(self, levers: tuple[str, ...]) -> None:
        def spec(b: int) -> TrialSpec:
            return TrialSpec(levers, None if b == self.batch else b)

        run = lambda b: self.pool.run(spec(b))  # noqa: E731
        try:
            self.answers[levers] = find_batch(run, self.batch, self.capacity, max_batch=self.max_batch)
        except (Stopped, CancelledError):  # fit was interrupted: its caller says so
            return

    def finish(self, rows: list[FitRow]) -> list[FitRow]:
        """The rows with the largest batch that fits with each one's levers (not for
        rows that failed), once every search has ended."""
        for row in rows:
            if row.fits != "failed":
                self.start(row.levers)
        for thread in self.threads.values():
            thread.join()
        missing = [row.label for row in rows if row.fits != "failed" and row.levers not in self.answers]
        if missing:
            raise RuntimeError(f"the batch search failed for {', '.join(missing)}")
        return [replace(row, batch=self.answers.get(row.levers)) for row in rows]


def check_trial_options(
    script: str | os.PathLike[str],
    include: Sequence[str],
    max_iterations: int | None,
    max_seconds: float | None,
    engine: str,
) -> None:
    """``UsageError``, before any trial runs, for what every trial's ``run`` would refuse
    (``fit``'s and ``fit_distributed``'s)."""
    from ..runner.checks import check_budgets, check_engine, readable_script, resolve_includes

    path = readable_script(str(script))
    resolve_includes(tuple(str(name) for name in include), path)
    check_budgets(max_iterations, max_seconds)
    check_engine(engine)


def trial_run_options(
    include: Sequence[str],
    max_iterations: int | None,
    max_seconds: float | None,
    run_to_end: bool,
    end_script: bool,
    engine: str,
) -> tuple[str, ...]:
    """``run``'s options for every trial, of fit's and of fit --nproc-per-node's."""
    out: list[str] = [token for path in include for token in ("--include", str(path))]
    if max_iterations is not None:
        out += ["--max-iterations", str(max_iterations)]
    if max_seconds is not None:
        out += ["--max-seconds", str(max_seconds)]
    if run_to_end:
        out.append("--run-to-end")
    if end_script:
        out.append("--end-script")
    if engine != "auto":
        out += ["--engine", engine]
    return tuple(out)
