"""Where ``plot`` writes its texts so they neither overlap each other nor cover a curve.

Pure geometry on display coordinates (pixels, y up, as matplotlib's ``transData`` gives
them); ``plot`` measures the texts and the curves and draws what these functions decide.

- ``spread``: the stamp labels, written rotated along the top of the chart, moved
  sideways as little as possible so that neighbours stay at least one text height
  apart (a leader line joins a moved label to its stamp);
- ``place_box``: the peak annotation of each run, put at the free spot nearest its peak
  that no curve crosses and no other text covers (an arrow points to the peak).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["Box", "occupancy", "overlaps", "place_box", "spread"]

#: ``(left, bottom, right, top)`` in pixels.
Box = tuple[float, float, float, float]


def spread(positions: Sequence[float], gap: float, low: float, high: float) -> list[float]:
    """New positions for items at ``positions`` (ascending), in the same order, each at
    least ``gap`` from the next, all within ``[low, high]``, each run of crowded items
    centred on where they were (the least total squared shift). When more items are
    given than ``[low, high]`` holds at ``gap``, they are packed from ``low`` at ``gap``
    apart (the caller keeps fewer)."""
    if any(b < a for a, b in zip(positions, positions[1:])):
        raise ValueError("positions must be in ascending order")
    blocks: list[list[float]] = []  # [count, sum of (position - gap * index in block)]
    for position in positions:
        blocks.append([1, position])
        while len(blocks) > 1:
            (count, total), (next_count, next_total) = blocks[-2], blocks[-1]
            if _start(blocks[-2], gap, low, high) + count * gap <= _start(blocks[-1], gap, low, high):
                break
            # The later block's items sit ``count`` places further into the merged block.
            blocks[-2:] = [[count + next_count, total + next_total - next_count * count * gap]]
    placed: list[float] = []
    for block in blocks:
        start = _start(block, gap, low, high)
        placed.extend(start + index * gap for index in range(int(block[0])))
    return placed


def _start(block: list[float], gap: float, low: float, high: float) -> float:
    count, total = block
    return max(low, min(total / count, high - (count - 1) * gap))


def occupancy(segments: Any, bounds: Box, cell: float = 2.0) -> Any:
    """Which ``cell``-pixel squares of ``bounds`` the ``segments`` (an ``(n, 4)`` array of
    ``x0, y0, x1, y1`` in pixels) pass through: a boolean array, row 0 at the bottom.
    Each segment is sampled every half cell, so no square it crosses is missed."""
    import numpy as np

    left, bottom, right, top = bounds
    grid = np.zeros(
        (max(1, math.ceil((top - bottom) / cell)), max(1, math.ceil((right - left) / cell))), bool
    )
    segments = np.asarray(segments, dtype=float).reshape(-1, 4)
    segments = segments[np.isfinite(segments).all(axis=1)]
    if not len(segments):
        return grid
    x0, y0, x1, y1 = segments.T
    steps = np.ceil(np.hypot(x1 - x0, y1 - y0) / (cell / 2)).astype(int) + 1
    owner = np.repeat(np.arange(len(segments)), steps)
    fraction = (np.arange(steps.sum()) - np.repeat(np.cumsum(steps) - steps, steps)) / np.repeat(
        np.maximum(steps - 1, 1), steps
    )
    xs = x0[owner] + fraction * (x1 - x0)[owner]
    ys = y0[owner] + fraction * (y1 - y0)[owner]
    columns = np.floor((xs - left) / cell).astype(int)
    rows = np.floor((ys - bottom) / cell).astype(int)
    keep = (columns >= 0) & (columns < grid.shape[1]) & (rows >= 0) & (rows < grid.shape[0])
    grid[rows[keep], columns[keep]] = True
    return grid


def overlaps(a: Box, b: Box) -> bool:
    """Whether two boxes share any area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_box(
    anchor: tuple[float, float],
    size: tuple[float, float],
    grid: Any,
    bounds: Box,
    taken: Sequence[Box] = (),
    cell: float = 2.0,
    clearance: float = 8.0,
) -> Box:
    """Where to put a box of ``size`` (width, height, pixels) annotating ``anchor``: inside
    ``bounds``, at least ``clearance`` from ``anchor``, overlapping no box of ``taken``;
    of those, the nearest to ``anchor`` that covers no marked square of ``grid`` (see
    ``occupancy``, same ``bounds`` and ``cell``); when every such spot covers some, the
    one covering fewest (then the nearest). Spots are tried every ``cell`` pixels."""
    import numpy as np

    left, bottom, _, _ = bounds
    wide, high = math.ceil(size[0] / cell), math.ceil(size[1] / cell)
    rows, columns = grid.shape[0] - high + 1, grid.shape[1] - wide + 1
    if rows < 1 or columns < 1:  # no room at all: beside the anchor, whatever it covers
        return (anchor[0] + clearance, anchor[1], anchor[0] + clearance + size[0], anchor[1] + size[1])
    table = np.zeros((grid.shape[0] + 1, grid.shape[1] + 1), int)
    table[1:, 1:] = grid.cumsum(0).cumsum(1)
    covered = table[high:, wide:] - table[:rows, wide:] - table[high:, :columns] + table[:rows, :columns]
    x = left + np.arange(columns) * cell
    y = bottom + np.arange(rows)[:, None] * cell
    dx = np.maximum(np.maximum(x - anchor[0], 0), anchor[0] - (x + size[0]))
    dy = np.maximum(np.maximum(y - anchor[1], 0), anchor[1] - (y + size[1]))
    distance = np.hypot(dx, dy)
    allowed = distance >= clearance
    for other in taken:
        allowed &= ~((x < other[2]) & (other[0] < x + size[0]) & (y < other[3]) & (other[1] < y + size[1]))
    if not allowed.any():
        return (anchor[0] + clearance, anchor[1], anchor[0] + clearance + size[0], anchor[1] + size[1])
    cost = np.where(allowed, covered, np.iinfo(int).max)
    least = cost.min()
    row, column = np.unravel_index(np.argmin(np.where(cost == least, distance, np.inf)), cost.shape)
    spot_x, spot_y = float(x[column]), float(y[row, 0])
    return (spot_x, spot_y, spot_x + size[0], spot_y + size[1])
