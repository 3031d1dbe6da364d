"""Check a recorded cache state against the allocator's rules: what any snapshot taken
with these settings must satisfy if the model's rules are torch's (non-expandable
segments; expandable ones are skipped)."""

from __future__ import annotations

from collections.abc import Sequence

from ..snapshotfile.records import Segment
from .settings import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorSettings,
    round_size,
)

__all__ = ["rule_violations"]


def rule_violations(segments: Sequence[Segment], settings: AllocatorSettings) -> tuple[int, list[str]]:
    """The number of checks made and a line per violation. Checked: segment sizes (2 MiB
    small; 20 MiB or a 2 MiB multiple of at least 10 MiB large), blocks tiling their
    segment in 512 B multiples, no two free neighbours (they merge), small-pool blocks of
    exactly the rounded request, large-pool blocks at most 1 MiB over it (unsplit
    remainder; more for oversize blocks), free large-pool blocks in a split segment
    over 1 MiB (a split keeps only such remainders)."""
    checks, problems = 0, []
    for segment in segments:
        if segment.is_expandable:
            continue
        where = f"segment {segment.address:#x}"
        checks += 1
        if not _segment_size_ok(segment):
            problems.append(f"{where}: {segment.segment_type} segment of {segment.total_size} B")
        at = segment.address
        previous_free = False
        for block in segment.blocks:
            checks += 1
            problem = _block_problem(segment, block, at, previous_free, settings)
            if problem:
                problems.append(f"{where} block {block.address:#x}: {problem}")
            at = block.address + block.size
            previous_free = block.state == "inactive"
        if at != segment.end:
            problems.append(f"{where}: blocks end at {at:#x}, not at the segment's end")
    return checks, problems


def _segment_size_ok(segment: Segment) -> bool:
    size = segment.total_size
    if segment.segment_type == "small":
        return size == K_SMALL_BUFFER
    return size == K_LARGE_BUFFER or (size % K_ROUND_LARGE == 0 and size >= K_MIN_LARGE_ALLOC)


def _block_problem(segment, block, at: int, previous_free: bool, settings: AllocatorSettings) -> str:
    if block.address != at:
        return f"starts at {block.address:#x}, expected {at:#x}"
    if block.size % K_MIN_BLOCK_SIZE:
        return f"size {block.size} is not a multiple of {K_MIN_BLOCK_SIZE}"
    free = block.state == "inactive"
    if free and previous_free:
        return "free next to a free block (they should have merged)"
    small = segment.segment_type == "small"
    if free:
        if not small and len(segment.blocks) > 1 and block.size <= K_SMALL_SIZE:
            return f"free large-pool remainder of {block.size} B (splits leave more than 1 MiB)"
        return ""
    rounded = round_size(block.requested_size, settings)
    if small and block.size != rounded:
        return f"small block of {block.size} B for a request of {block.requested_size} B"
    if not small and not rounded <= block.size <= rounded + settings.unsplit_slack(rounded):
        return f"large block of {block.size} B for a request of {block.requested_size} B"
    return ""
