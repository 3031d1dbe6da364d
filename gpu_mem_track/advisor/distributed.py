"""``fit_distributed``: how many GPUs, with which sharding, at what batch per GPU.

Every trial simulates the script's distinct ranks (``world.RanksRunner``: rank 0 and
the last rank, each alone in torch's fake process group) and answers with the worst
rank's figures. The order:

1. the script as it is at ``nproc`` ranks (a script written for one GPU runs as torchrun
   would run it: every rank the whole job);
2. the distributed levers at ``nproc`` ranks, side by side (``SHARDED``): ZeRO's
   optimizer, FSDP2 on the repeated blocks (instead of any DDP wrap), and FSDP2 with
   each of its options (``no-reshard``, ``fsdp2-bf16``, ``cpu-offload``; for a script
   that shards itself, the options act on its own ``fully_shard`` calls);
2b. when nothing fits under the threshold at ``nproc`` ranks, the sharding row with the
   most headroom combined with the single-GPU levers that cut activations
   (``ACTIVATIONS``: ``autocast`` and ``checkpoint``, each alone side by side, then both
   when both applied and neither fits; where that row changes the numbers, ``fsdp2``
   with ``checkpoint`` too): at most 4 trials more;
3. more (or fewer) ranks: the smallest world size of ``WORLDS`` at which the cheapest
   sharding that applied fits (a bisection: a sharded rank's memory falls as ranks are
   added; each size tried is a trial; a size whose trial failed for a reason other than
   memory leaves the bisection, which goes on over the others);
4. with a batch argument, the largest batch per GPU that fits for every row and for the
   world size found (``batch.find_batch``, each point a trial).

Every "fits" is a completed simulated run of every distinct rank.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .batch import BatchArg, check_max_batch, find_batch
from .plan import label, make_row
from .records import BatchAnswer, FitRow, Trial
from .render import flat_text, short_line
from .trials import SubprocessRunner, TrialPool, TrialSpec, session_folder
from .world import RanksRunner, WorldSpec, rank_of

__all__ = ["ACTIVATIONS", "SHARDED", "WORLDS", "DistributedFit", "WorldRow", "fit_distributed"]

#: The lever sets tried at the asked world size, cheapest first.
SHARDED: tuple[tuple[str, ...], ...] = (
    ("zero",),
    ("fsdp2",),
    ("fsdp2", "no-reshard"),
    ("fsdp2", "fsdp2-bf16"),
    ("fsdp2", "cpu-offload"),
)
#: The single-GPU levers tried with the best sharding when nothing fits at the asked
#: size: those that cut the activations, which no sharding divides (the optimizer and
#: allocator levers act on what sharding already divides, or on fragmentation).
ACTIVATIONS: tuple[str, ...] = ("autocast", "checkpoint")
#: The world sizes the search for more ranks may answer.
WORLDS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class WorldRow:
    """One row: ``row`` (its figures are the worst rank's) at ``world`` ranks; ``rank``
    the rank whose figures they are (None: unknown)."""

    row: FitRow
    world: int
    rank: int | None
    accum: int | None = None  # a gradient accumulation row: the accumulation argument's value

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row.to_dict(), "world": self.world, "rank": self.rank, "accum": self.accum}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorldRow:
        return cls(FitRow.from_dict(data["row"]), int(data["world"]), data.get("rank"), data.get("accum"))


@dataclass(frozen=True)
class DistributedFit:
    """The answer per GPU for ``script`` on ``nproc`` x ``gpu``: ``rows`` (the script
    as it is first), ``worlds`` (world size -> fits, for the sizes tried with
    ``sharding``, the levers of the search), ``world_failures`` (world size -> why, for
    the sizes whose trial failed for a reason other than memory: the exception and its
    line; the search went on without them), ``world`` (the smallest that fits, None:
    none), ``answer`` (one sentence), ``launch`` (the lines to write and the command to
    launch), ``not_applied`` ((lever, why)), ``verdict`` (``"fits"``: as it is,
    ``"found"``, ``"none"``, ``"failed"``), ``recommended`` (the index in ``rows`` of
    the row the answer and the launch lines are for; None: none)."""

    script: str
    args: tuple[str, ...]
    gpu: str
    capacity: int
    nproc: int
    threshold: float
    verdict: str
    rows: tuple[WorldRow, ...]
    sharding: tuple[str, ...]
    worlds: tuple[tuple[int, str], ...]
    world: int | None
    answer: str
    launch: tuple[str, ...]
    not_applied: tuple[tuple[str, str], ...]
    folder: str
    trials: int
    seconds: float
    batch_arg: str | None = None
    batch: int | None = None
    recommended: int | None = None
    world_failures: tuple[tuple[int, str], ...] = ()

    @property
    def exit_code(self) -> int:
        """0: it fits as asked (or a change found fits at the asked batch); 3: it fits
        only at a smaller batch per GPU; 1: nothing fits, or the script failed."""
        if self.verdict not in ("fits", "found"):
            return 1
        fitting = [r.row for r in self.rows if r.row.fits in ("yes", "tight") and r.accum is None]
        return 0 if fitting or self.world is not None else 3

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rows"] = [r.to_dict() for r in self.rows]
        out["args"], out["sharding"] = list(self.args), list(self.sharding)
        out["worlds"] = [list(w) for w in self.worlds]
        out["world_failures"] = [list(w) for w in self.world_failures]
        out["not_applied"] = [list(p) for p in self.not_applied]
        out["launch"] = list(self.launch)
        return out


def fit_distributed(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    gpu: str,
    nproc: int,
    batch_arg: str | int | None = None,
    threshold: float = 0.9,
    jobs: int | None = None,
    out_dir: str | os.PathLike[str] = "reports",
    max_batch: int | None = None,
    accum_arg: str | int | None = None,
    include: Sequence[str] = (),
    max_iterations: int | None = None,
    max_seconds: float | None = None,
    run_to_end: bool = False,
    end_script: bool = False,
    engine: str = "auto",
    runner: Callable[[TrialSpec], Trial] | None = None,
    progress: Callable[[str], None] | None = None,
) -> DistributedFit:
    """See the module doc. ``nproc``: the ranks (GPUs) asked for, 1 to 64; ``accum_arg``
    (with ``batch_arg``): where ``args`` set the gradient accumulation steps, written as
    ``batch_arg`` is; ``jobs``: the cores the trials may use (None: the cores available;
    a trial runs its two ranks side by side, so ``jobs // 2`` trials at a time, at least
    one). The rest as ``api.fit``'s keywords of the same names (``include``,
    ``max_iterations``, ``max_seconds``, ``run_to_end``, ``end_script`` and ``engine``
    are passed to every rank's ``run``); ``runner`` replaces the ranks' child processes
    (tests). ``UsageError`` for a bad GPU, count, option or argument, before any trial
    runs."""
    from ..simgpu.catalog import parse_gpu
    from .api import check_trial_options, default_jobs, trial_run_options

    started = time.monotonic()
    spec = parse_gpu(gpu)
    if nproc < 1 or nproc > WORLDS[-1]:
        raise UsageError(f"--nproc-per-node takes a count in 1..{WORLDS[-1]}, not {nproc}")
    if not 0 < threshold <= 1:
        raise UsageError(f"--threshold takes a fraction in (0, 1], not {threshold}")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs takes a count >= 1, not {jobs}")
    if not Path(script).is_file():
        raise UsageError(f"{script}: no such script")
    check_trial_options(script, include, max_iterations, max_seconds, engine)
    args = tuple(str(a) for a in args)
    where = BatchArg.parse(batch_arg) if batch_arg is not None else None
    user_batch = where.value(args) if where is not None else None
    check_max_batch(max_batch, user_batch)
    accum = BatchArg.parse(accum_arg) if accum_arg is not None else None
    if accum is not None and where is None:
        raise UsageError("--accum-arg needs --batch-arg: the accumulation makes up for a smaller batch")
    user_accum = accum.value(args) if accum is not None else None
    folder = session_folder(Path(out_dir), Path(script))
    if runner is None:
        from .forked import preload_script_imports, resume

        resume()  # a fit before in this process may have been interrupted
        preload_script_imports(script)
        options = trial_run_options(include, max_iterations, max_seconds, run_to_end, end_script, engine)
        base = SubprocessRunner(str(script), args, gpu, folder, options, where)
        runner = RanksRunner(base, accum_arg=accum)
    say = progress or (lambda line: None)
    jobs = max(1, (default_jobs() if jobs is None else jobs) // 2)  # a trial runs two ranks
    pool = TrialPool(runner, jobs, say)
    try:
        found = _Search(pool, nproc, threshold, say).run()
        batches: dict[tuple[tuple[str, ...], int], BatchAnswer] = {}
        if where is not None and user_batch is not None:
            batches = _batches(pool, found, user_batch, max_batch)
        rows = tuple(
            WorldRow(replace(make_row(t, threshold), batch=batches.get((t.levers, w))), w, rank_of(t))
            for t, w in found.rows
        )
        if user_accum is not None and user_batch is not None:
            rows += _accumulated(pool, rows, user_batch, user_accum, nproc, threshold, str(accum_arg))
    except KeyboardInterrupt as exc:  # as api.fit: every trial's ranks ended, then FitInterrupted
        from .api import FitInterrupted

        raise FitInterrupted.stopping(pool, folder, exc) from None
    finally:
        pool.close()
    capacity = found.baseline.capacity or spec.capacity
    worlds = tuple(sorted((w, t.fits(threshold)) for w, t in found.worlds.items()))
    failures = tuple(
        sorted((w, _failure(t)) for w, t in found.worlds.items() if t.fits(threshold) == "failed")
    )
    verdict = _verdict(rows, found.world)
    best = _best(rows, found.world)
    return DistributedFit(
        script=str(script),
        args=args,
        gpu=spec.name,
        capacity=capacity,
        nproc=nproc,
        threshold=threshold,
        verdict=verdict,
        rows=rows,
        sharding=found.sharding,
        worlds=worlds,
        world=found.world,
        answer=_answer(rows, best, worlds, found.world, found.sharding, spec.name, nproc, failures),
        launch=_launch(best, str(script), args, nproc, found.world),
        not_applied=tuple(found.not_applied),
        folder=str(folder),
        trials=pool.count,
        seconds=round(time.monotonic() - started, 1),
        batch_arg=None if where is None else str(batch_arg),
        batch=user_batch,
        recommended=next((i for i, row in enumerate(rows) if row is best), None),
        world_failures=failures,
    )


def _failure(trial: Trial) -> str:
    """Why a trial failed for a reason other than memory, in one line: the exception and
    its line where the trial's log had them (``trials.raised_in``), else what it recorded."""
    return trial.error or (f"it ended at {trial.peak_at}" if trial.peak_at else "no result")


class _Search:
    """Steps 1 to 3 of the module doc; ``rows``: (trial, world size)."""

    def __init__(self, pool: TrialPool, nproc: int, threshold: float, say: Callable[[str], None]) -> None:
        self.pool, self.nproc, self.threshold, self.say = pool, nproc, threshold, say
        self.rows: list[tuple[Trial, int]] = []
        self.not_applied: list[tuple[str, str]] = []
        self.worlds: dict[int, Trial] = {}
        self.world: int | None = None
        self.sharding: tuple[str, ...] = ()
        self.baseline: Trial

    def trial(self, levers: tuple[str, ...], world: int) -> Trial:
        return self.pool.run(WorldSpec(levers, None, world, self.nproc))

    def run(self) -> _Search:
        self.baseline = self.trial((), self.nproc)
        self.rows.append((self.baseline, self.nproc))
        if self.baseline.fits(self.threshold) in ("failed", "yes"):
            return self  # failed for another reason, or fits as it is: nothing to change
        self.say(
            f"as it is on {self.nproc} ranks: {self.baseline.fits(self.threshold)}; "
            "trying the sharding levers"
        )
        tried = self.pool.run_all(WorldSpec(s, None, self.nproc, self.nproc) for s in SHARDED)
        why: dict[str, str] = {}
        for trial in tried:
            applied = tuple(n.name for n in trial.notes if n.applied)
            for note in trial.notes:
                if not note.applied and note.name not in why:
                    why[note.name] = note.reason
            if applied and applied == tuple(n for n in trial.levers if n in applied):
                if all(applied != t.levers for t, _ in self.rows):
                    self.rows.append((replace(trial, levers=applied), self.nproc))
        done = {n for t, _ in self.rows for n in t.levers}
        self.not_applied = [(name, reason) for name, reason in why.items() if name not in done]
        sharding = self._sharding()
        if not any(t.fits(self.threshold) == "yes" for t, _ in self.rows):
            self._with_single_gpu_levers(sharding == ())
        if sharding is not None:
            self.sharding = sharding
            self._worlds()
        return self

    def _with_single_gpu_levers(self, shards_itself: bool) -> None:
        """Step 2b of the module doc: the sharding row with the most headroom (the least
        shortfall; the script as it is when it shards itself) with ``ACTIVATIONS``'
        levers, each alone side by side, then both when each applied and neither fits.
        Where that row changes the script's numbers (``fsdp2-bf16``), ``fsdp2`` (else the
        row with the most headroom of those that keep them) runs with ``checkpoint``
        beside them, listed first, so that a fit that keeps the numbers is the one
        recommended: ZeRO's headroom, say, tells little of what checkpointing adds to it.
        A combination whose single-GPU lever did not apply is no row: it goes to
        ``not_applied`` with why (autocast on a script that already computes in
        bfloat16/float16 says so, as with one GPU). Not with ``autocast`` where the row
        has ``fsdp2-bf16`` (its forward computes in bfloat16 already)."""
        rows = [t for t, _ in self.rows if t.fits(self.threshold) != "failed" and (t.levers or shards_itself)]
        if not rows:
            return
        base = max(rows, key=_headroom)  # the first (cheapest) of the best
        names = list(ACTIVATIONS)
        if "fsdp2-bf16" in base.levers:
            names.remove("autocast")
            why = "fsdp2-bf16 computes the forward in bfloat16 already: autocast changes little"
            self.not_applied.append((label((*base.levers, "autocast")), why))
        combos = [(*base.levers, n) for n in names]
        keeping = [t for t in rows if not _changes_results(t.levers)]
        plain = next((t for t in keeping if t.levers == ("fsdp2",)), None)  # FSDP2 + checkpointing
        plain = plain or (max(keeping, key=_headroom) if keeping else None)
        if plain is not None and _changes_results(base.levers):  # its numbers kept, first
            combos.insert(0, (*plain.levers, "checkpoint"))
        self.say(f"nothing fits on {self.nproc} ranks; trying {', '.join(label(c) for c in combos)}")
        tried = self.pool.run_all(WorldSpec(c, None, self.nproc, self.nproc) for c in combos)
        applied = [trial for trial in tried if self._combined(trial) and trial.levers[:-1] == base.levers]
        if len(applied) == len(ACTIVATIONS) and not any(t.fits(self.threshold) == "yes" for t in applied):
            self._combined(self.trial((*base.levers, *ACTIVATIONS), self.nproc))

    def _combined(self, trial: Trial) -> bool:
        """A combination's trial at the asked size: its row when every lever applied
        (True), else ``not_applied`` gets why (False)."""
        missing = [n for n in trial.notes if not n.applied]
        if missing:
            reasons = "; ".join(f"{n.name}: {n.reason or 'not applied'}" for n in missing)
            self.not_applied.append((label(trial.levers), reasons))
            return False
        self.rows.append((trial, self.nproc))
        return True

    def _sharding(self) -> tuple[str, ...] | None:
        """The levers the world search uses: FSDP2 where it applied, else nothing for
        a script that shards itself (a fully_shard option applied), else ZeRO."""
        have = {t.levers for t, _ in self.rows}
        if ("fsdp2",) in have:
            return ("fsdp2",)
        if any(levers and "fsdp2" not in levers for levers in have if levers != ("zero",)):
            return ()
        return ("zero",) if ("zero",) in have else None

    def _worlds(self) -> None:
        """The smallest of ``WORLDS`` that fits with ``sharding``: a bisection over the
        sizes still in question. A size whose trial failed for a reason other than memory
        says nothing about memory: it leaves the candidates and the bisection goes on
        over the others (memory per rank falls as ranks are added, so the order holds
        on what is left)."""
        fits = lambda t: t.fits(self.threshold) == "yes"  # noqa: E731  (tight is no world to recommend)
        known = next(t for t, w in self.rows if t.levers == self.sharding and w == self.nproc)
        self.worlds[self.nproc] = known
        candidates = [w for w in WORLDS if w != self.nproc]
        best: int | None = None
        if known.fits(self.threshold) != "failed":
            best = self.nproc if fits(known) else None
            candidates = [w for w in candidates if (w < self.nproc) == fits(known)]
        while candidates:
            mid = len(candidates) // 2
            world = candidates[mid]
            self.say(f"{label(self.sharding)} on {world} ranks")
            trial = self.trial(self.sharding, world)
            self.worlds[world] = trial
            if trial.fits(self.threshold) == "failed":
                del candidates[mid]
            elif fits(trial):
                best, candidates = world, candidates[:mid]
            else:
                candidates = candidates[mid + 1 :]
        self.world = best
        if best is not None and best != self.nproc:
            self.rows.append((self.worlds[best], best))


def _changes_results(levers: tuple[str, ...]) -> bool:
    """Whether any of ``levers`` changes the script's numbers (``fsdp2-bf16``, ``autocast``)."""
    from ..levers.catalog import describe

    return any(describe(name).changes_results for name in levers)


def _headroom(trial: Trial) -> int:
    """Bytes left under the capacity at the trial's reserved peak; minus the shortfall
    when it ran out of memory."""
    if trial.oom is not None:
        return -trial.oom.shortfall
    return trial.capacity - (trial.reserved_peak or 0)


def _batches(
    pool: TrialPool, found: _Search, batch: int, max_batch: int | None
) -> dict[tuple[tuple[str, ...], int], BatchAnswer]:
    """The largest batch per GPU for each row that did not fail, searched side by side."""
    out: dict[tuple[tuple[str, ...], int], BatchAnswer] = {}
    capacity = found.baseline.capacity

    def search(levers: tuple[str, ...], world: int) -> None:
        def at(b: int) -> Trial:
            return pool.run(WorldSpec(levers, None if b == batch else b, world, found.nproc))

        out[(levers, world)] = find_batch(at, batch, capacity, max_batch=max_batch or 1 << 20)

    threads = [
        threading.Thread(target=search, args=(t.levers, w), daemon=True)
        for t, w in found.rows
        if t.fits(found.threshold) != "failed"
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def _accumulated(
    pool: TrialPool,
    rows: tuple[WorldRow, ...],
    batch: int,
    accum: int,
    nproc: int,
    threshold: float,
    accum_arg: str,
) -> tuple[WorldRow, ...]:
    """Gradient accumulation at a smaller batch per GPU: for the first row that does not
    fit at the asked batch but fits at a smaller one ``b`` (its batch search), one trial
    at ``b`` with the accumulation argument ``accum`` x ceil(batch / b), so a step sees as
    many samples; its row is labelled with both."""
    for item in rows:
        answer = item.row.batch
        if item.row.fits in ("yes", "tight") or answer is None or not 0 < answer.batch < batch:
            continue
        times = -(-batch // answer.batch)
        trial = pool.run(WorldSpec(item.row.levers, answer.batch, item.world, nproc, accum * times))
        row = make_row(trial, threshold)
        text = (
            f"{item.row.label} at batch {answer.batch} x {times} accumulation ({accum_arg}={accum * times})"
        )
        return (WorldRow(replace(row, label=text), item.world, rank_of(trial), accum * times),)
    return ()


def _verdict(rows: tuple[WorldRow, ...], world: int | None) -> str:
    first = rows[0].row
    if first.fits == "failed":
        return "failed"
    if first.fits in ("yes", "tight"):
        return "fits"
    if any(r.row.fits in ("yes", "tight") for r in rows[1:]) or world is not None:
        return "found"
    if any(r.row.batch is not None and r.row.batch.batch > 0 for r in rows):
        return "found"
    return "none"


def _best(rows: tuple[WorldRow, ...], world: int | None) -> WorldRow | None:
    """The row to recommend: at the asked size, the first change that fits under the
    threshold (cheapest first), else the script as it is when it fits, else any that
    fits tight; else the world search's; else the first with a batch that fits."""
    asked = [r for r in rows if r.world == rows[0].world]
    for wanted in ("yes", "tight"):
        for row in [*asked[1:], asked[0]]:
            if row.row.fits == wanted:
                return row
    for row in rows:
        if row.world == world and row.row.fits in ("yes", "tight"):
            return row
    return next((r for r in rows if r.row.batch is not None and r.row.batch.batch > 0), None)


def _answer(
    rows: tuple[WorldRow, ...],
    best: WorldRow | None,
    worlds: tuple[tuple[int, str], ...],
    world: int | None,
    sharding: tuple[str, ...] | None,
    gpu: str,
    nproc: int,
    failures: tuple[tuple[int, str], ...] = (),
) -> str:
    """One sentence: where it fits, with what, at what batch per GPU; where not; which
    world sizes failed for another reason, and why."""
    if rows[0].row.fits == "failed":
        return f"the script failed on {nproc} x {gpu} for a reason other than memory: {rows[0].row.line}"
    failed = _failed_text(failures)
    if best is None:
        tried = ", ".join(str(w) for w, fits in worlds if fits != "failed") or str(nproc)
        return f"does not fit on {tried} x {gpu} with what was tried{failed}"
    how = "as it is" if not best.row.label or best.row.label == "as it is" else f"with {best.row.label}"
    text = f"fits on {best.world} x {gpu} {how}"
    if best.row.fits in ("no", "failed") and best.row.batch is not None:
        text += f" only at batch {best.row.batch.batch} per GPU"
    elif best.row.batch is not None and best.row.batch.flat_from is not None:
        text += f", at any batch per GPU ({flat_text(best.row.batch)})"
    elif best.row.batch is not None and best.row.batch.batch > 0:
        text += f", up to batch {best.row.batch.batch} per GPU"  # the largest found, not the batch run
    if world is not None and world < best.world:
        text += f"; with {label(sharding or ())} from {world} GPU{'s' * (world != 1)}"
    elif world is not None and world > best.world and sharding is not None and best.row.levers != sharding:
        alone = f"with {label(sharding)} alone" if sharding else "as it is"
        text += f"; {alone} from {world} GPU{'s' * (world != 1)}"
    limit = min(best.world, world or best.world)
    smaller = [(w, fits) for w, fits in worlds if w < limit and fits not in ("yes", "failed")]
    if smaller:
        below, fits = max(smaller)
        text += f"; not on {below}" if fits != "tight" else f"; on {below} only above the threshold (tight)"
    return text + failed


def _failed_text(failures: tuple[tuple[int, str], ...]) -> str:
    """``"; failed on 32, 64 (not memory: why)"``: the world sizes whose trial failed for
    another reason, those with the same reason together; "" when none did."""
    reasons: dict[str, list[int]] = {}
    for world, why in failures:
        reasons.setdefault(why, []).append(world)
    return "".join(
        f"; failed on {', '.join(map(str, worlds))} (not memory: {why})" for why, worlds in reasons.items()
    )


def _launch(
    best: WorldRow | None, script: str, args: tuple[str, ...], nproc: int, world: int | None
) -> tuple[str, ...]:
    """The command to launch and the lines to write for the recommended row."""
    if best is None:
        return ()
    n = best.world
    command = f"torchrun --nproc-per-node {min(n, 8)}"
    if n > 8:
        command += f" --nnodes {(n + 7) // 8}"
    lines = [f"{command} {script} {' '.join(args)}".rstrip()]
    notes = {name: None for name in best.row.levers}
    group_started = False  # the device's line below starts the process group
    if "fsdp2" in notes or "zero" in notes:
        if "init_process_group" in best.row.change:
            group_started = True
            lines += [
                "import os, torch.distributed as dist; dist.init_process_group('nccl'); "
                "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
                "sampler = torch.utils.data.DistributedSampler(dataset)  "
                "# then DataLoader(dataset, sampler=sampler, ...)",
            ]
        if "fsdp2" in notes:
            lines.append(
                "from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy"
            )
        if "zero" in notes:
            lines.append("from torch.distributed.optim import ZeroRedundancyOptimizer")
    edits = best.row.edits or ((best.row.change, ""),)  # a row read from before edits were kept
    for change, where in edits:
        parts = [part.strip() for part in change.split("; ") if part.strip()]
        if group_started:  # the device's line above starts it: not twice
            parts = [p for p in parts if not p.startswith("dist.init_process_group(")]
        for i, part in enumerate(parts):
            lines.append(f"{part}  # at {short_line(where)}" if where and i == 0 else part)
    return tuple(lines)
