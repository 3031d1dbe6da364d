"""The ranks of distributed launches compared: the ranks of one launch folder side by
side (each against rank 0), or two launch folders rank by rank (B minus A).

A launch folder is what ``gpu_mem_track run`` writes under torchrun (see
``gpu_mem_track.ranks`` and ``runfolder.ranktable``): ``<launch>/rank<k>/`` per rank. The
figures come from each rank's ``meta.json``: bytes of the rank's memory source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..ranks import is_launch_folder, rank_folders
from ..runfolder.ranktable import LaunchSummary, RankSummary, read_launch
from ..units import format_bytes

__all__ = ["RankPair", "RankComparison", "compare_launches", "expand_launches", "render_rank_comparison"]


@dataclass(frozen=True)
class RankPair:
    """One rank in both launches (``a``/``b``: None where that launch lacks the rank).
    ``difference``: B's peak minus A's (bytes), or, for one launch, the rank's peak minus
    rank 0's; None where a peak is unknown."""

    rank: int
    a: RankSummary | None
    b: RankSummary | None
    difference: int | None


@dataclass(frozen=True)
class RankComparison:
    """Launch ``a`` against launch ``b`` rank by rank, or (``b`` None) the ranks of ``a``
    against its rank 0; ``rows`` in rank order."""

    a: LaunchSummary
    b: LaunchSummary | None
    rows: tuple[RankPair, ...]


def compare_launches(a: str | Path, b: str | Path | None = None) -> RankComparison:
    """Compare the ranks of launch folder ``a`` (against its rank 0), or launch folders
    ``a`` and ``b`` rank by rank. ``UsageError`` when a path is not a launch folder."""
    first = _launch(a)
    if b is None:
        base = first.ranks[0].peak if first.ranks else None
        rows = [RankPair(r.rank, r, None, _minus(r.peak, base)) for r in first.ranks]
        return RankComparison(first, None, tuple(rows))
    second = _launch(b)
    count = max(len(first.ranks), len(second.ranks))
    rows = []
    for rank in range(count):
        left = first.ranks[rank] if rank < len(first.ranks) else None
        right = second.ranks[rank] if rank < len(second.ranks) else None
        rows.append(RankPair(rank, left, right, _minus(_peak(right), _peak(left))))
    return RankComparison(first, second, tuple(rows))


def expand_launches(paths: Sequence[str | Path]) -> list[Path]:
    """``paths`` with each launch folder replaced by its ``rank<k>`` run folders (in rank
    order), so a launch plots or loads as its ranks."""
    out: list[Path] = []
    for path in map(Path, paths):
        out.extend(rank_folders(path).values() if is_launch_folder(path) else [path])
    return out


def render_rank_comparison(comparison: RankComparison) -> str:
    """The comparison as text: what is compared, then one row per rank."""
    a, b = comparison.a, comparison.b
    if b is None:
        head = f"Launch {a.launch}: {a.world_size} ranks{_spread(a)}; Diff: the rank's peak minus rank 0's"
        table = [f"{'Rank':>4}  {'Status':<8}  {'Peak':>11}  {'Diff':>11}  {'At end':>11}  Peak at (phase)"]
        for row in comparison.rows:
            r = row.a
            assert r is not None
            table.append(
                f"{r.rank:>4}  {r.status:<8}  {_bytes(r.peak):>11}  {_signed(row.difference):>11}  "
                f"{_bytes(r.end_memory):>11}  {_where(r)}"
            )
    else:
        head = f"A {a.launch}{_spread(a)} | B {b.launch}{_spread(b)}; B-A: peak of B's rank minus A's"
        table = [
            f"{'Rank':>4}  {'A peak':>11}  {'B peak':>11}  {'B-A':>11}  A peak at (phase) | B peak at (phase)"
        ]
        for row in comparison.rows:
            table.append(
                f"{row.rank:>4}  {_bytes(_peak(row.a)):>11}  {_bytes(_peak(row.b)):>11}  "
                f"{_signed(row.difference):>11}  {_where(row.a)} | {_where(row.b)}"
            )
    table.insert(1, "=" * len(table[0]))
    return "\n".join([head, *table]) + "\n"


def _launch(path: str | Path) -> LaunchSummary:
    if not Path(path).is_dir():
        raise UsageError(f"no such launch folder: {path}")
    try:
        return read_launch(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _peak(summary: RankSummary | None) -> int | None:
    return None if summary is None else summary.peak


def _minus(value: int | None, base: int | None) -> int | None:
    return None if value is None or base is None else value - base


def _spread(summary: LaunchSummary) -> str:
    spread = summary.spread
    return "" if spread is None else f" (spread {spread:.3f})"


def _where(summary: RankSummary | None) -> str:
    if summary is None:
        return "(no such rank)"
    if summary.status == "missing":
        return "(missing)"
    phase = f" ({summary.peak_phase})" if summary.peak_phase else ""
    return f"{summary.peak_at or '-'}{phase}"


def _bytes(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _signed(value: int | None) -> str:
    return "-" if value is None else format_bytes(value, signed=True)
