"""Counting agreement between a recorded and a predicted set of things."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..snapshotfile.records import Block, Segment

__all__ = ["Tally", "compare_final"]


@dataclass(frozen=True)
class Tally:
    """``recorded`` things, ``predicted`` things, ``matched``: those in both."""

    recorded: int
    predicted: int
    matched: int

    @property
    def exact(self) -> bool:
        """All recorded ones predicted, and nothing else."""
        return self.recorded == self.predicted == self.matched

    def __str__(self) -> str:
        return f"{self.matched}/{self.recorded} matched ({self.predicted} predicted)"


def _block_key(block: Block) -> tuple[int, int, str, int | None]:
    live = block.state != "inactive"
    return (block.address, block.size, block.state, block.requested_size if live else None)


def _segment_key(segment: Segment) -> tuple:
    return (
        segment.address,
        segment.total_size,
        segment.segment_type,
        segment.stream,
        tuple(_block_key(b) for b in segment.blocks),
    )


def compare_final(recorded: Sequence[Segment], predicted: Sequence[Segment]) -> tuple[Tally, Tally]:
    """Segments (equal when address, size, type, stream and every block agree) and
    blocks (address, size, state, and the request when live), recorded vs predicted."""
    seg = Counter(map(_segment_key, recorded)) & Counter(map(_segment_key, predicted))
    rec_blocks = Counter(_block_key(b) for s in recorded for b in s.blocks)
    pred_blocks = Counter(_block_key(b) for s in predicted for b in s.blocks)
    return (
        Tally(len(recorded), len(predicted), sum(seg.values())),
        Tally(sum(rec_blocks.values()), sum(pred_blocks.values()), sum((rec_blocks & pred_blocks).values())),
    )
