"""The batch argument (where the script's arguments set the batch) and the batch search.

``BatchArg.parse("--batch_size")`` names an option, given as ``--batch_size=32`` or
``--batch_size 32`` (the last occurrence wins, as argparse reads it);
``BatchArg.parse("0")`` a positional index into the arguments after the script, counted
from 0 (index 0 is what the script reads as ``sys.argv[1]``). The search reuses
``estimator.search.search_batch_size``: peaks at a few batches, a fitted line, a jump
to the batch it predicts, a confirmation there and at the next batch. Every batch it
evaluates is a simulated trial; a trial that runs out of memory (or fails) does not fit.
The budget is the capacity (a trial fits when it completes within it); the trial at the
user's batch, already run, is reused as one of the points, and when it does not fit the
batch is halved until one does (``start_batches``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import UsageError
from .records import BatchAnswer, Trial

__all__ = ["BatchArg", "check_max_batch", "find_batch", "start_batches"]


@dataclass(frozen=True)
class BatchArg:
    """Where the batch is in a script's arguments: an ``option`` (``"--batch_size"``)
    or a positional ``index`` (0: the first argument after the script)."""

    option: str | None = None
    index: int | None = None

    @classmethod
    def parse(cls, text: str | int) -> BatchArg:
        """``"--batch_size"`` (anything starting with ``-``) or an index ``>= 0``."""
        text = str(text).strip()
        if text.startswith("-") and len(text) > 1 and not text.lstrip("-").isdigit():
            return cls(option=text.split("=", 1)[0])
        try:
            index = int(text)
        except ValueError:
            index = -1
        if index < 0:
            raise UsageError(
                f"--batch-arg takes an option (e.g. --batch_size) or an index >= 0, not {text!r}"
            )
        return cls(index=index)

    def __str__(self) -> str:
        return self.option if self.option is not None else f"argument {self.index}"

    def took(self, args: Sequence[str]) -> str:
        """Which of ``args`` an index takes, in words: ``"'32', the 1st argument after
        the script (sys.argv[1])"``; "" for an option."""
        if self.index is None:
            return ""
        where = f"the {_ordinal(self.index + 1)} argument after the script (sys.argv[{self.index + 1}])"
        return f"{args[self.index]!r}, {where}" if self.index < len(args) else where

    def _position(self, args: Sequence[str]) -> tuple[int, bool]:
        """``(index of the token holding the value, whether it is ``option=value``)``."""
        if self.index is not None:
            if self.index >= len(args):
                given = " ".join(args) if args else "none"
                raise UsageError(
                    f"--batch-arg {self.index} (counted from 0) names {self.took(args)}, but the script has "
                    f"{len(args)} argument(s): {given}"
                )
            return self.index, False
        found: tuple[int, bool] | None = None
        for i, token in enumerate(args):
            if token == "--":
                break
            if token.startswith(f"{self.option}="):
                found = (i, True)
            elif token == self.option:
                if i + 1 >= len(args):
                    raise UsageError(
                        f"--batch-arg {self.option}: no value follows it in the script's arguments"
                    )
                found = (i + 1, False)
        if found is None:
            raise UsageError(f"--batch-arg {self.option}: the script's arguments do not hold it")
        return found

    def value(self, args: Sequence[str]) -> int:
        """The batch the arguments set; ``UsageError`` when they do not hold it or it is
        not a positive integer."""
        at, joined = self._position(args)
        text = args[at].split("=", 1)[1] if joined else args[at]
        try:
            batch = int(text)
        except ValueError:
            batch = 0
        if batch < 1:
            if self.index is not None:
                raise UsageError(
                    f"--batch-arg {self.index} (counted from 0) took {self.took(args)}: not a positive "
                    "integer (0 is the first argument after the script)"
                )
            raise UsageError(f"--batch-arg {self}: its value {text!r} is not a positive integer")
        return batch

    def with_batch(self, args: Sequence[str], batch: int) -> tuple[str, ...]:
        """``args`` with the batch set to ``batch`` (nothing else changed)."""
        at, joined = self._position(args)
        out = list(args)
        out[at] = f"{self.option}={batch}" if joined else str(batch)
        return tuple(out)


def check_max_batch(max_batch: int | None, batch: int | None) -> None:
    """``UsageError`` for a ``max_batch`` the search cannot use: one under 1, one without
    a batch to search (no ``--batch-arg``), or one below the batch the script runs, where
    the answer would say the script fits at its batch and that a smaller one is the
    largest that fits."""
    if max_batch is None:
        return
    if max_batch < 1:
        raise UsageError(f"--max-batch takes a count >= 1, not {max_batch}")
    if batch is None:
        raise UsageError("--max-batch bounds the batch search: give --batch-arg too")
    if max_batch < batch:
        raise UsageError(f"--max-batch {max_batch} is below the batch the script runs ({batch})")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def start_batches(run: Callable[[int], Trial], batch: int) -> tuple[int, ...]:
    """The batches the search starts from, ascending, their trials run by ``run(b)``:
    half of ``batch`` and ``batch`` when it fits there (two points give the line);
    else ``batch`` is halved until a trial fits, and the search starts from that batch
    and the one above it in the halving that did not fit; ``()`` when not even batch 1
    fits."""
    failing = None
    while not run(batch).completed:
        if batch == 1:
            return ()
        failing, batch = batch, batch // 2
    if failing is not None:
        return (batch, failing)
    return (batch // 2, batch) if batch > 1 else (batch,)


#: How far above a batch whose peaks equal a smaller batch's ``find_batch`` tries once,
#: to tell a peak that stopped growing from one that rounding kept the same.
FLAT_JUMP = 1024


class _Flat(Exception):
    """The peak stopped growing with the batch: the trial at ``batch`` has the peaks of
    smaller ones (``find_batch``)."""

    def __init__(self, batch: int) -> None:
        super().__init__(batch)
        self.batch = batch


def find_batch(
    trial_at: Callable[[int], Trial],
    batch: int,
    capacity: int,
    *,
    max_batch: int = 1 << 20,
    max_trials: int = 10,
) -> BatchAnswer:
    """The largest batch ``<= max_batch`` whose trial completes within ``capacity``.

    ``trial_at(b)`` runs (or recalls) the trial at batch ``b``; ``batch`` is the user's,
    whose trial is one of the points (``start_batches``). A trial that ran out of memory
    counts, for the line, as needing what it had reserved plus the request that failed
    (a lower bound: it stopped there); one that failed otherwise does not fit. At most
    ``max_trials`` batches are evaluated after the start.

    A peak that stops growing ends the search: when a completed trial has the same
    allocated and reserved peaks as a smaller batch's, one trial at ``FLAT_JUMP`` times
    the batch (at most ``max_batch``) tells whether the batch still matters; when that one
    has them too, every step takes no more samples than the smaller batch (a dataset
    smaller than the batch, or a batch argument the steps do not follow), and the answer
    is the largest batch tried, with ``flat_from`` (``BatchAnswer``). Where rounding kept
    two small batches' peaks equal, the jump's peak differs and the search goes on.
    """
    from ..estimator.search import search_batch_size  # no torch: the trials import it

    trials: dict[int, Trial] = {}
    jumped: set[int] = set()

    def run(b: int) -> Trial:
        trials[b] = trial_at(b)
        return trials[b]

    def peak_of(b: int) -> int | None:
        trial = run(b)
        if trial.completed:
            check_flat(b)
            return trial.reserved_peak
        if trial.oom is not None:
            return max(trial.oom.reserved + trial.oom.request, capacity + 1)
        return None

    def check_flat(b: int) -> None:
        if not _same_peaks(trials, b) or b in jumped:
            return
        far = min(max_batch, b * FLAT_JUMP)
        jumped.update((b, far))
        if far == b or (run(far).completed and _peaks(trials[far]) == _peaks(trials[b])):
            raise _Flat(far)

    try:
        samples = start_batches(run, min(batch, max_batch))
        if not samples:
            return BatchAnswer(batch=0, reserved_peak=None, folder="", tried=tuple(trials))
        result = search_batch_size(
            peak_of,
            capacity,
            samples=samples,
            max_batch=max_batch,
            max_probes=max_trials + len(samples),
            confirm_above=True,
            source="simulated trials",
        )
    except _Flat as flat:
        best = trials[flat.batch]
        flat_from = min(b for b in trials if trials[b].completed and _peaks(trials[b]) == _peaks(best))
        return BatchAnswer(flat.batch, best.reserved_peak, best.folder, tuple(trials), flat_from)
    best = trials.get(result.batch)
    return BatchAnswer(
        batch=result.batch,
        reserved_peak=None if best is None else best.reserved_peak,
        folder="" if best is None else best.folder,
        tried=tuple(trials),
    )


def _peaks(trial: Trial) -> tuple[int | None, int | None]:
    return trial.peak, trial.reserved_peak


def _same_peaks(trials: dict[int, Trial], b: int) -> bool:
    """Whether a completed trial at a smaller batch than ``b`` has the peaks of ``b``'s."""
    peaks = _peaks(trials[b])
    return any(other < b and t.completed and _peaks(t) == peaks for other, t in trials.items())
