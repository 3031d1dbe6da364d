"""A memory snapshot of the simulated GPU in PyTorch's format (the dictionary
``torch.cuda.memory._snapshot()`` returns and ``_dump_snapshot`` pickles).

Segments and blocks come from the allocator model (``allocator.export_segments``); an
allocated block carries the Python stack of its allocation when history was being
recorded (``_record_memory_history``), as a real snapshot does with ``stacks="python"``
(no C++ frames). ``device_traces`` holds the recorded trace (alloc, free_requested,
free_completed, segment_alloc, segment_free, oom), oldest first, each entry with its
Python stack and a time in microseconds since the session began. ``allocator_settings``
names the ``PYTORCH_CUDA_ALLOC_CONF`` in force, as torch 2.5+ does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..allocator import export_segments
from ..snapshotfile.records import Snapshot

if TYPE_CHECKING:
    from .running import RunningGpu

__all__ = ["make_snapshot"]


def make_snapshot(gpu: RunningGpu) -> dict[str, Any]:
    """The snapshot dictionary of ``gpu`` now (see the module doc)."""
    memory = gpu.memory
    segments = []
    for segment in export_segments(gpu.allocator):
        blocks = tuple(
            replace(b, frames=memory.block_frames.get(b.address, ())) if b.state != "inactive" else b
            for b in segment.blocks
        )
        segments.append(replace(segment, blocks=blocks))
    trace = tuple(memory.history or ())
    settings = gpu.allocator.settings
    snapshot = Snapshot(tuple(segments), (trace,), _settings(settings))
    return snapshot.to_dict()


def _settings(settings: Any) -> dict[str, Any]:
    split = settings.max_split_size
    return {
        "PYTORCH_CUDA_ALLOC_CONF": settings.conf_string(),
        "max_split_size": -1 if split is None else split,
        "garbage_collection_threshold": settings.garbage_collection_threshold,
        "expandable_segments": settings.expandable_segments,
        "pinned_num_register_threads": 1,
        "release_lock_on_malloc": False,
        "pinned_use_host_register": False,
        "roundup_power2_divisions": {1 << i: d for i, d in enumerate(settings.roundup_power2_divisions)},
    }
