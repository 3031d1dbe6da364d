"""The batch search without a device: the largest batch whose peak fits a budget.

``search_batch_size(peak_of, budget)`` evaluates the peak at a few small batches, fits
``peak(batch) = intercept + slope * batch``, jumps to the batch the line predicts,
confirms there and only then narrows (interpolating, with bisection as a safeguard).
Where the peaks come from is the caller's: the estimator and measured steps
(``batchsize``), simulated trials of a whole script (``advisor.batch``). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import UsageError
from .records import BatchProbe, BatchSizeResult

__all__ = ["MAX_JUMP", "PeakFunction", "search_batch_size"]

PeakFunction = Callable[[int], "int | None"]


def search_batch_size(
    peak_of: PeakFunction,
    budget: int,
    *,
    samples: Sequence[int] = (1, 2, 4),
    max_batch: int = 1 << 20,
    max_probes: int = 24,
    confirm_above: bool = True,
    source: str = "custom",
    budget_source: str = "given",
) -> BatchSizeResult:
    """The largest batch ``b <= max_batch`` with ``peak_of(b) <= budget`` (bytes).

    ``peak_of(batch)`` returns the step's peak in bytes, or ``None`` when the step could
    not run (a caught out-of-memory error counts as not fitting). ``samples`` are the
    small batches evaluated first, ascending. The answer is confirmed by evaluating it;
    with ``confirm_above`` the next batch is evaluated too (to prove it does not fit),
    otherwise the fitted slope must predict that it does not. Assumes the peak grows
    with the batch. Evaluates at most ``max_probes`` batches.
    """
    if budget <= 0:
        raise UsageError(f"the memory budget must be positive, not {budget} B")
    if not samples or sorted(set(samples)) != list(samples) or samples[0] < 1:
        raise UsageError(f"the sample batches must be positive and ascending, not {list(samples)}")
    probes: list[BatchProbe] = []

    def probe(batch: int) -> BatchProbe:
        result = BatchProbe(batch, peak_of(batch))
        probes.append(result)
        return result

    for batch in samples:
        if not probe(batch).fits(budget):
            break
    intercept, slope = _fit([p for p in probes if p.peak is not None])  # from the samples
    while len(probes) < max_probes:
        low, high = _bracket(probes, budget)
        if low is None or (high is not None and high.batch == low.batch + 1) or low.batch >= max_batch:
            break
        if high is None and not confirm_above and _predicted_over(probes, low, slope, budget):
            break
        probe(_next_batch(probes, low, high, slope, budget, max_batch))
    low, _ = _bracket(probes, budget)
    if low is not None:
        intercept, slope = _line_near(probes, low, (intercept, slope))
    return BatchSizeResult(
        batch=low.batch if low else 0,
        budget=budget,
        peak=low.peak if low else None,
        margin=budget - low.peak if low and low.peak is not None else None,
        intercept=intercept,
        slope=slope,
        probes=tuple(probes),
        source=source,
        budget_source=budget_source,
    )


def _fit(points: list[BatchProbe]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` through the points (slope 0 for one point)."""
    if not points:
        return 0.0, 0.0
    mean_b = sum(p.batch for p in points) / len(points)
    mean_p = sum(p.peak for p in points) / len(points)
    spread = sum((p.batch - mean_b) ** 2 for p in points)
    slope = sum((p.batch - mean_b) * (p.peak - mean_p) for p in points) / spread if spread else 0.0
    return mean_p - slope * mean_b, slope


def _line_near(
    probes: list[BatchProbe], low: BatchProbe, fallback: tuple[float, float]
) -> tuple[float, float]:
    """``(intercept, slope)`` of the line through ``low`` and the nearest probe at most 3/4
    of its batch (else its nearest other probe). Not the batch just above: block rounding
    makes one sample's step a whole block or none, a slope off by 2x and a start below 0."""
    far = [p for p in probes if p.peak is not None and p.batch <= low.batch * 3 // 4]
    slope = _slope(low, max(far, key=lambda p: p.batch)) if far else _secant(probes, low)
    if slope is None:
        return fallback
    return low.peak - slope * low.batch, slope


def _secant(probes: list[BatchProbe], low: BatchProbe) -> float | None:
    """Bytes per sample between ``low`` and the nearest other probe that ran (None: none ran)."""
    others = [p for p in probes if p.peak is not None and p.batch != low.batch]
    if not others:
        return None
    return _slope(low, min(others, key=lambda p: abs(p.batch - low.batch)))


def _slope(a: BatchProbe, b: BatchProbe) -> float:
    """Bytes per sample on the line through two probes that ran."""
    return (b.peak - a.peak) / (b.batch - a.batch)


def _bracket(probes: list[BatchProbe], budget: int) -> tuple[BatchProbe | None, BatchProbe | None]:
    """The largest probe that fits and the smallest that does not (either may be ``None``)."""
    fitting = [p for p in probes if p.fits(budget)]
    failing = [p for p in probes if not p.fits(budget)]
    low = max(fitting, key=lambda p: p.batch, default=None)
    high = min(failing, key=lambda p: p.batch, default=None)
    if low is not None and high is not None and high.batch < low.batch:
        high = None  # a non-monotonic peak; trust the larger batch that fits
    return low, high


def _local_slope(probes: list[BatchProbe], low: BatchProbe, slope: float) -> float:
    """The secant at ``low`` (see ``_secant``) when it rises, else the fitted ``slope``."""
    local = _secant(probes, low)
    return local if local is not None and local > 0 else slope


def _same_side_run(probes: list[BatchProbe], budget: int) -> int:
    """How many of the last probes in a row landed on the same side of the budget."""
    side, run = probes[-1].fits(budget), 0
    for probe in reversed(probes):
        if probe.fits(budget) != side:
            break
        run += 1
    return run


def _on_plateau(probes: list[BatchProbe]) -> bool:
    """Whether the last probe's peak equals an earlier probe's (at another batch)."""
    last = probes[-1]
    return last.peak is not None and any(p.peak == last.peak and p.batch != last.batch for p in probes[:-1])


def _predicted_over(probes: list[BatchProbe], low: BatchProbe, slope: float, budget: int) -> bool:
    local = _local_slope(probes, low, slope)
    return local > 0 and low.peak + local > budget


#: Without a failing probe yet, a jump goes at most this many times past the largest fit:
#: the peak at small batches can be dominated by terms that do not grow with the batch.
MAX_JUMP = 16


def _next_batch(
    probes: list[BatchProbe],
    low: BatchProbe,
    high: BatchProbe | None,
    slope: float,
    budget: int,
    max_batch: int,
) -> int:
    if high is None:
        local = _local_slope(probes, low, slope)
        guess = low.batch + int((budget - low.peak) // local) if local > 0 else low.batch * MAX_JUMP
        return min(max(guess, low.batch + 1), low.batch * MAX_JUMP, max_batch)
    if _on_plateau(probes) or low.peak == budget:
        # A stepped peak (reserved memory grows by whole segments): the last probe
        # repeated an earlier peak, or the largest fit sits at the budget itself, so
        # lines and gallops would crawl along a flat step; bisect.
        return (low.batch + high.batch) // 2
    run = _same_side_run(probes, budget)
    if run >= 2:  # interpolation stalls on one side: gallop away from it, doubling the step
        step = 2 ** (run - 1)
        guess = high.batch - step if not probes[-1].fits(budget) else low.batch + step
        return min(max(guess, low.batch + 1), high.batch - 1)
    if high.peak is None:  # it did not run: approach from below, so few more probes fail
        return low.batch + max(1, (high.batch - low.batch) // 4)
    if high.peak <= low.peak:
        return (low.batch + high.batch) // 2
    local = _slope(low, high)  # the secant across the bracket
    guess = low.batch + int((budget - low.peak) // local)
    return min(max(guess, low.batch + 1), high.batch - 1)
