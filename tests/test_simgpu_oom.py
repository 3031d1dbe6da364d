"""The simulated GPU's out-of-memory error after the allocator's recovery
(``simgpu.engine.GpuMemory`` over ``allocator.recovery``): the figures of torch's message
(c10/cuda/CUDACachingAllocator.cpp, ``malloc``) and what ``set_per_process_memory_fraction``
limits on the simulated GPU."""

from __future__ import annotations

import pytest
import torch

from gpu_mem_track.simgpu.catalog import parse_gpu
from gpu_mem_track.simgpu.engine import GpuMemory, format_size
from gpu_mem_track.simgpu.records import OutOfMemory

MIB = 2**20
GIB = 2**30


def _memory() -> tuple[GpuMemory, list[OutOfMemory]]:
    seen: list[OutOfMemory] = []
    spec = parse_gpu("2GiB:sm90")  # 2 GiB total, 500 MiB context: the allocator may reserve 1548 MiB
    return GpuMemory(spec, on_oom=seen.append), seen


def test_message_figures_after_the_release() -> None:
    """After the release of the cache: "Tried to allocate" the segment, "of which X is
    free" the device's free bytes (total less context less reserved), "this process has
    Y" reserved plus the context, and "reserved but unallocated" only the free part of
    split segments (the whole cached one was released)."""
    memory, seen = _memory()
    keep, _ = memory.take(700 * MIB)
    part, _ = memory.take(3 * MIB)  # a 20 MiB segment: 17 MiB free in it after the split
    cached, _ = memory.take(400 * MIB)
    memory.give_back(cached)  # a whole cached 400 MiB segment
    with pytest.raises(torch.OutOfMemoryError) as info:
        memory.take(900 * MIB)
    text = str(info.value)
    reserved = 720 * MIB
    assert "Tried to allocate 900.00 MiB" in text
    assert f"of which {format_size(1548 * MIB - reserved)} is free" in text
    assert f"this process has {format_size(reserved + 500 * MIB)} memory in use" in text
    assert "Of the allocated memory 703.00 MiB is allocated by PyTorch, and 17.00 MiB is reserved" in text
    assert "allowed" not in text
    assert seen[0].reserved == reserved and seen[0].capacity == 1548 * MIB
    stats = memory.allocator.stats
    assert (stats.num_ooms, stats.num_alloc_retries, stats.num_sync_all_streams) == (1, 1, 1)


def test_memory_fraction_is_of_the_total_and_leaves_the_free_figure_alone() -> None:
    """``set_per_process_memory_fraction(0.5)``: 1 GiB allowed (half the total, the
    context not counted), "1024.00 MiB allowed; " in the message, while "of which X is free"
    stays the device's; the record's capacity is the allowed bytes."""
    memory, seen = _memory()
    memory.set_fraction(0.5)
    keep, _ = memory.take(800 * MIB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        memory.take(300 * MIB)  # 800 + 300 > 1024 MiB allowed, < 1548 MiB the device has
    text = str(info.value)
    assert "1024.00 MiB allowed; Of the allocated memory" in text  # format_size: MiB up to 1 GiB
    assert f"of which {format_size(1548 * MIB - 800 * MIB)} is free" in text
    assert seen[0].capacity == GIB
    assert memory.allocator.device.capacity == 1548 * MIB  # the device is not shrunk
    memory.set_fraction(1.0)  # no limit any more
    assert memory.allowed is None
    memory.take(300 * MIB)


def test_fraction_over_the_capacity_leaves_the_device_limit() -> None:
    """A fraction above what the device leaves the allocator: the device's capacity rules."""
    memory, seen = _memory()
    memory.set_fraction(0.9)  # 1.8 GiB allowed, 1548 MiB on the device
    with pytest.raises(torch.OutOfMemoryError):
        memory.take(1600 * MIB)
    assert seen[0].capacity == 1548 * MIB
