"""Which trials the advisor runs, and the cheapest combination of levers that fits.

The levers, cheapest first, are ``levers.LEVERS`` (the names ``run --lever`` takes): the
allocator's expandable segments, gradients set to None, the optimizer without foreach,
the fused optimizer, the allocator's garbage-collection threshold, mixed precision
(autocast, which changes results) and activation checkpointing (about one more forward
pass of compute).

The combination (``cheapest_combination``), tried only when no lever fits alone: the
levers that applied alone, in that order, are accumulated (``a + b``, ``a + b + c``,
...; each set run as one trial, up to ``jobs`` sets at a time) until a set fits; then
each of its levers but the last added is dropped in turn, cheapest first, while the
set without it still fits (one trial per drop tried). Its answer is the smallest set
found this way, not the cheapest of all subsets (that would take a trial each).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import UsageError
from ..levers import LEVERS, check_levers
from .records import FitRow, Trial
from .trials import TrialPool, TrialSpec

__all__ = ["LEVERS", "cheapest_combination", "make_row", "parse_levers", "rank"]

#: How good a trial's ``fits`` is: higher is better.
_GOOD = {"yes": 2, "tight": 1, "no": 0, "failed": 0}


def parse_levers(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """The levers named (``"a,b"`` or a sequence; None: all), cheapest first;
    ``UsageError`` for an unknown name or one given twice."""
    if text is None:
        return LEVERS
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [str(n).strip() for n in text]
    names = [n for n in names if n]
    if not names:
        raise UsageError(f"--levers names none; the levers are: {', '.join(LEVERS)}")
    checked = check_levers(names)
    distributed = [n for n in checked if n not in LEVERS]
    if distributed:
        raise UsageError(f"--levers {distributed[0]}: a distributed lever, which fit --nproc-per-node tries")
    return tuple(sorted(checked, key=LEVERS.index))


def rank(levers: Sequence[str]) -> tuple[int, int]:
    """Sort key, cheapest first: a set's most expensive lever, then its size."""
    return (max((LEVERS.index(n) for n in levers), default=-1), len(levers))


def label(levers: Sequence[str]) -> str:
    """A row's label: ``"as it is"`` or the levers joined with ``" + "``."""
    return " + ".join(levers) if levers else "as it is"


def cheapest_combination(
    pool: TrialPool, applied: Sequence[str], threshold: float, jobs: int
) -> tuple[list[Trial], Trial | None]:
    """(the combination trials run, the one chosen: None when no set fits). See the
    module's docstring; ``applied`` are the levers that applied alone, cheapest first."""
    prefixes = [tuple(applied[:n]) for n in range(2, len(applied) + 1)]
    run: list[Trial] = []
    found: Trial | None = None
    for start in range(0, len(prefixes), max(1, jobs)):
        wave = pool.run_all(TrialSpec(p) for p in prefixes[start : start + max(1, jobs)])
        run.extend(wave)
        fitting = [t for t in wave if t.fits(threshold) in ("yes", "tight")]
        if fitting:
            best = max(_GOOD[t.fits(threshold)] for t in fitting)
            found = min((t for t in fitting if _GOOD[t.fits(threshold)] == best), key=lambda t: len(t.levers))
            break
    if found is None:
        return run, None
    for name in found.levers[:-1]:
        smaller = tuple(n for n in found.levers if n != name)
        if len(smaller) < 2:  # a single lever already ran alone and did not fit
            continue
        trial = pool.run(TrialSpec(smaller))
        run.append(trial)
        if _GOOD[trial.fits(threshold)] >= _GOOD[found.fits(threshold)]:
            found = trial
    return run, found


def make_row(trial: Trial, threshold: float) -> FitRow:
    """The table's row for ``trial`` (its batch answer is added later)."""
    fits = trial.fits(threshold)
    applied = [n for n in trial.notes if n.applied]
    if trial.oom is not None:
        margin, at_least, line = -trial.oom.shortfall, True, trial.oom.at
        peak = max(trial.peak or 0, trial.oom.allocated)  # the highest before it ran out
        reserved = max(trial.reserved_peak or 0, trial.oom.reserved)
    else:
        done = trial.completed
        margin = trial.capacity - trial.reserved_peak if done and trial.reserved_peak is not None else None
        at_least, line, peak, reserved = False, trial.peak_at, trial.peak, trial.reserved_peak
    return FitRow(
        label=label(trial.levers),
        levers=trial.levers,
        peak=peak,
        reserved_peak=reserved,
        fits=fits,
        margin=margin,
        at_least=at_least,
        line=(trial.error or line) if fits == "failed" else line,  # a failure: what ended it, where
        cost="; ".join(n.cost for n in applied if n.cost) if trial.levers else "",
        change="; ".join(n.change for n in applied if n.change),
        edits=tuple((n.change, n.where) for n in applied if n.change),
        changes_results=any(n.changes_results for n in applied),
        folder=trial.folder,
        stopped=trial.stopped,
    )
