"""Trials of a script's ranks: each rank simulated alone, as torchrun would start it.

A trial at world size N (``WorldSpec``) runs the script once per distinct rank with the
variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``), so ``run --simulate`` gives
it its own simulated GPU and torch's fake process group (``simgpu.ranks``): collectives
move nothing, so a rank needs no other rank to run. The distinct ranks: rank 0, and the
last rank (N - 1), where FSDP2's dim-0 shards can differ (it pads the last chunk; every
rank between holds full chunks, as rank 0 does). Ranks 1 .. N-2 are not run: rank 0
stands for them. What a rank cannot see: data that differs per rank (a sampler's last,
shorter batch), values a collective would have brought, NCCL's own memory.

The trial's answer is the worst rank's: one that ran out of memory (the first in rank
order), else the one with the highest reserved peak. Its run folder is
``<session>/<trial>/rank<k>/``, so the rank is in ``Trial.folder`` (``rank_of``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .forked import run_forked
from .records import Trial
from .trials import SubprocessRunner, TrialSpec, last_line, raised_in, read_trial

__all__ = ["RanksRunner", "WorldSpec", "distinct_ranks", "rank_environ", "rank_of", "worst"]

_RANK = re.compile(r"rank(\d+)$")


@dataclass(frozen=True)
class WorldSpec(TrialSpec):
    """A trial at ``world`` ranks (``nproc`` of them per node)."""

    world: int = 1
    nproc: int = 1
    accum: int | None = None  # the accumulation argument's value (None: as given)

    @property
    def name(self) -> str:
        return f"{super().name}-w{self.world}" + (f"-a{self.accum}" if self.accum is not None else "")


def distinct_ranks(world: int) -> tuple[int, ...]:
    """The ranks simulated for ``world``: 0, and the last when there are several."""
    return (0,) if world <= 1 else (0, world - 1)


def rank_environ(base: Mapping[str, str], rank: int, world: int, nproc: int, run_id: str) -> dict[str, str]:
    """``base`` with torchrun's variables for ``rank`` of ``world`` ranks, ``nproc`` per node."""
    local_world = max(1, min(world, nproc))
    return {
        **base,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % local_world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": run_id,
    }


def rank_of(trial: Trial) -> int | None:
    """The rank whose run folder ``trial.folder`` is (None: not a rank's)."""
    found = _RANK.search(trial.folder.rstrip("/"))
    return int(found.group(1)) if found else None


def worst(trials: list[Trial]) -> Trial:
    """The trial that answers for a world: the first that ran out of memory, else the
    first that failed, else the highest reserved peak (rank order breaks ties)."""
    for trial in trials:
        if trial.oom is not None:
            return trial
    for trial in trials:
        if not trial.completed:
            return trial
    return max(trials, key=lambda t: t.reserved_peak or 0)


@dataclass(frozen=True)
class RanksRunner:
    """Runs a ``WorldSpec``'s distinct ranks (side by side) through ``base``'s command,
    each with its rank's environment; the worst rank's ``Trial`` answers."""

    base: SubprocessRunner
    environ: Mapping[str, str] | None = None
    accum_arg: Any = None  # where the args set the accumulation steps (``batch.BatchArg``)

    def __call__(self, spec: TrialSpec) -> Trial:
        world = spec.world if isinstance(spec, WorldSpec) else 1
        nproc = spec.nproc if isinstance(spec, WorldSpec) else 1
        ranks = distinct_ranks(world)
        with ThreadPoolExecutor(max_workers=len(ranks)) as pool:
            trials = list(pool.map(lambda r: self._rank(spec, r, world, nproc), ranks))
        return worst(trials)

    def _rank(self, spec: TrialSpec, rank: int, world: int, nproc: int) -> Trial:
        folder = self.base.folder
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / f"{spec.name}-rank{rank}.log"
        base = _without_launch(os.environ if self.environ is None else self.environ)
        env = rank_environ(base, rank, world, nproc, spec.name)
        base = self.base
        if isinstance(spec, WorldSpec) and spec.accum is not None and self.accum_arg is not None:
            base = replace(base, args=self.accum_arg.with_batch(base.args, spec.accum))
        code = run_forked(base.command(spec)[3:], Path.cwd(), log, env)
        trial = read_trial(folder / spec.name / f"rank{rank}", spec.levers, spec.batch, code)
        if trial.error.startswith("no run description"):
            tail = last_line(log)
            return Trial(spec.levers, spec.batch, trial.folder, code, error=tail or trial.error)
        if trial.error:  # failed for another reason than memory: say which exception, where
            raised = raised_in(log, self.base.script)
            return replace(trial, error=raised) if raised else trial
        return trial


#: The variables torchrun sets for a worker (``torch.distributed.elastic``'s local agent
#: and its ``multiprocessing.api``), besides ``MASTER_ADDR``/``MASTER_PORT``, which
#: ``rank_environ`` sets anew. ``TORCHELASTIC_ERROR_FILE`` above all: a trial's rank that
#: inherited it would write its failure where torchrun reads fit's own.
_LAUNCH = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"}


def _without_launch(environ: Mapping[str, str]) -> dict[str, Any]:
    """``environ`` without the variables of a launch ``fit`` itself may run under
    (``fit`` under torchrun: its trials' ranks are its own, not torchrun's)."""
    return {
        k: v for k, v in environ.items() if k not in _LAUNCH and not k.startswith(("TORCHELASTIC_", "ROLE_"))
    }
