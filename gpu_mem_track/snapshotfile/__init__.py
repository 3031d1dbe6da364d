"""The PyTorch memory snapshot format (``torch.cuda.memory._dump_snapshot`` pickles): its
records (``records``: segments, blocks, trace entries, frames) and a safe reader
(``load``, unpickling the file as ``stream`` reads and gunzips it, under a memory
``guard`` past which ``scan`` checks the pickle's ``shape`` building nothing; ``convert``
makes the records). The allocator model
(``allocator``) and the snapshot report (``snapshots``) both read it; it imports
neither, and no torch."""

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
