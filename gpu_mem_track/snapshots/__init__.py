"""PyTorch memory snapshots (``torch.cuda.memory._dump_snapshot`` pickles): the data
model (``records``) and a safe loader (``load``)."""

from __future__ import annotations

from .load import load_snapshot, loads_snapshot, snapshot_from_data, unpickle_plain
from .records import BLOCK_STATES, TRACE_ACTIONS, Block, Frame, Segment, Snapshot, TraceEntry

__all__ = [
    "BLOCK_STATES",
    "TRACE_ACTIONS",
    "Block",
    "Frame",
    "Segment",
    "Snapshot",
    "TraceEntry",
    "load_snapshot",
    "loads_snapshot",
    "snapshot_from_data",
    "unpickle_plain",
]
