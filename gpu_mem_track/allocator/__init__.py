"""A torch-free simulation of PyTorch's CUDA caching allocator.

``Allocator(settings, capacity)`` offers ``malloc(size, stream) -> address``,
``free(address)``, ``empty_cache()``, the statistics under torch's names
(``memory_stats()``, ``allocated``, ``reserved``, ``requested``), and the log of what
it did (``events``: allocs, frees, segment allocations and frees). Settings come from a
``PYTORCH_CUDA_ALLOC_CONF`` string (``parse_alloc_conf``) or a memory snapshot
(``settings_from_snapshot``). ``replay.replay`` replays a memory snapshot's trace
through the model, once, for both its users: the allocator check (``decisions``: every
recorded decision against the model's; ``replay.replay_snapshot``) and the ``snapshot``
report (``timeline``: allocated and reserved bytes after every event). ``rebuild``
recovers the cache at the trace's start, ``calls`` groups the events into calls,
``rules`` checks a recorded state.
"""

from __future__ import annotations

from .caching import Allocator
from .device import DeviceMemory, SimulatedDevice
from .records import AllocatorEvent, AllocatorStats, SimulatedOutOfMemory, Stat
from .settings import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorSettings,
    allocation_size,
    parse_alloc_conf,
    round_size,
    settings_from_snapshot,
)
from .state import export_segments, load_segments

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "Allocator",
    "AllocatorEvent",
    "AllocatorSettings",
    "AllocatorStats",
    "DeviceMemory",
    "SimulatedDevice",
    "SimulatedOutOfMemory",
    "Stat",
    "allocation_size",
    "export_segments",
    "load_segments",
    "parse_alloc_conf",
    "round_size",
    "settings_from_snapshot",
]
