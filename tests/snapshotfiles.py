"""Hand-built memory snapshots in the exact plain shape ``torch.cuda.memory._snapshot()``
returns (keys and value types as torch 2.x writes them; see torch/cuda/memory.py), and a
writer that pickles them as ``_dump_snapshot`` does (optionally gzip-compressed); and
``FIXTURES``, the folder of snapshots recorded on real GPUs (None when absent)."""

from __future__ import annotations

import gzip
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIB = 2**20
BASE = 0x7F00_0000_0000

#: A frame of user code, then the C++ frames torch puts innermost.
USER_FRAME = {"filename": "/src/train.py", "line": 12, "name": "step"}
CPP_FRAMES = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {
        "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        "filename": "",
        "line": 0,
    },
]
SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "roundup_power2_divisions": {str(2**i): 0 for i in range(16)},
}


def frames(line: int = 12) -> list[dict[str, Any]]:
    return [*CPP_FRAMES, dict(USER_FRAME, line=line)]


def block(
    address: int, size: int, requested: int = 0, state: str = "inactive", line: int = 12
) -> dict[str, Any]:
    live = state != "inactive"
    return {
        "address": address,
        "size": size,
        "requested_size": requested if live else 0,
        "state": state,
        "frames": frames(line) if live else [],
    }


def segment(
    address: int, blocks: Sequence[tuple[int, int, str]], segment_type: str = "large", stream: int = 0
) -> dict[str, Any]:
    """A segment from (size, requested, state) triples tiling it from ``address``."""
    out, at = [], address
    for size, requested, state in blocks:
        out.append(block(at, size, requested, state))
        at += size
    allocated = sum(b["size"] for b in out if b["state"] == "active_allocated")
    active = sum(b["size"] for b in out if b["state"] != "inactive")
    return {
        "device": 0,
        "address": address,
        "total_size": at - address,
        "allocated_size": allocated,
        "active_size": active,
        "requested_size": sum(b["requested_size"] for b in out),
        "stream": stream,
        "segment_type": segment_type,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": frames(),
        "blocks": out,
    }


def entry(
    action: str, addr: int, size: int, time_us: int = 0, stream: int = 0, line: int = 12
) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "time_us": time_us,
        "frames": frames(line),
    }


def snapshot(segments: Sequence[dict[str, Any]], trace: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {
        "segments": list(segments),
        "device_traces": [list(trace)],
        "allocator_settings": dict(SETTINGS),
        "external_annotations": [],
    }


def write(path: Path, data: Any, compress: bool = False) -> Path:
    raw = pickle.dumps(data)
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def _fixtures() -> Path | None:
    """The recorded snapshots: ``$GPU_MEM_TRACK_SNAPSHOTS``, else ``shared/fixtures/snapshots``
    beside the checkout (``../shared``) or one level further up (a worktree in a
    subfolder), as ``scripts/fixtures.py`` finds them; None when none is there."""
    root = Path(__file__).resolve().parents[1]
    given = os.environ.get("GPU_MEM_TRACK_SNAPSHOTS")
    candidates = [Path(given)] if given else []
    candidates += [up / "shared/fixtures/snapshots" for up in (root.parent, root.parent.parent)]
    return next((folder for folder in candidates if folder.is_dir()), None)


#: The folder of real snapshots recorded on GPUs, or None (tests using it skip).
FIXTURES = _fixtures()
