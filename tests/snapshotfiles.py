"""Hand-built memory snapshots in the exact plain shape ``torch.cuda.memory._snapshot()``
returns (keys and value types as torch 2.x writes them; see torch/cuda/memory.py), and a
writer that pickles them as ``_dump_snapshot`` does (optionally gzip-compressed); and
``FIXTURES``, the folder of snapshots recorded on real GPUs (None when absent)."""

from __future__ import annotations

import gzip
import itertools
import os
import pickle
from collections.abc import Iterator, Sequence
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
    subfolder), as ``scripts/_common/fixtures.py`` finds them; None when none is there."""
    root = Path(__file__).resolve().parents[1]
    given = os.environ.get("GPU_MEM_TRACK_SNAPSHOTS")
    candidates = [Path(given)] if given else []
    candidates += [up / "shared/fixtures/snapshots" for up in (root.parent, root.parent.parent)]
    return next((folder for folder in candidates if folder.is_dir()), None)


#: The folder of real snapshots recorded on GPUs, or None (tests using it skip).
FIXTURES = _fixtures()


# -- pickles that are not snapshots, written as a stream (never whole in memory) ------

#: What each bomb holds, by name: the values it repeats ``n`` times, and how.
BOMBS = {
    "ints": "[0] * n: a list of n zeros",
    "segment-ints": '{"segments": [0] * n}',
    "shared-dicts": '{"segments": [{}] * n}: n memo references to one dict',
    "fresh-dicts": '{"segments": [{} for _ in range(n)]}',
    "deep": "n lists, each in the one before",
    "marks": "n MARK opcodes in a row (nothing is built; the loader keeps each one's place)",
    "int-dict": "{i: 0 for i in range(n)}",
    "shared-entries": '{"segments": [], "device_traces": [[entry] * n]}: one entry repeated',
    "long-stack": "a trace entry whose frames are one frame repeated n times",
}
_BATCH = 1000


def _batches(n: int, item: bytes, op: bytes, per: int = 1) -> Iterator[bytes]:
    """MARK, up to 1,000 values, ``op`` (APPENDS, SETITEMS), as pickle batches them."""
    while n > 0:
        k = min(n, _BATCH)
        yield b"(" + item * (k // per) + op
        n -= k


def _bomb_parts(kind: str, n: int) -> Iterator[bytes]:
    segments = b"}\x94\x8c\x08segments\x94]\x94"  # memo 0: top, 1: "segments", 2: the list
    if kind == "ints":
        yield b"]\x94"
        yield from _batches(n, b"K\x00", b"e")
    elif kind == "segment-ints":
        yield segments
        yield from _batches(n, b"K\x00", b"e")
        yield b"s"
    elif kind == "shared-dicts":
        yield segments + b"(}\x94" + b"h\x03" * min(n - 1, _BATCH - 1) + b"e"
        yield from _batches(n - _BATCH, b"h\x03", b"e")
        yield b"s"
    elif kind == "fresh-dicts":
        yield segments
        yield from _batches(n, b"}", b"e")
        yield b"s"
    elif kind == "deep":
        yield b"]" * n + b"a" * (n - 1)
    elif kind == "marks":
        yield segments + b"(" * n
    elif kind == "int-dict":
        yield b"}\x94"
        for start in range(0, n, _BATCH):
            yield (
                b"("
                + b"".join(
                    b"J" + i.to_bytes(4, "little") + b"K\x00" for i in range(start, min(n, start + _BATCH))
                )
                + b"u"
            )
    elif kind in ("shared-entries", "long-stack"):
        frame = (  # USER_FRAME, memo 11-17 (the dict, its keys and values)
            b"}\x94(\x8c\x08filename\x94\x8c\x0d/src/train.py\x94\x8c\x04line\x94K\x0c"
            b"\x8c\x04name\x94\x8c\x04step\x94u"
        )
        if kind == "shared-entries":
            yield b"}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94]\x94"  # memo 0-5
            entry = b"}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x06frames\x94]\x94(" + frame + b"eu"
            yield b"(" + entry + b"h\x06" * min(n - 1, _BATCH - 1) + b"e"
            yield from _batches(n - _BATCH, b"h\x06", b"e")
            yield b"au"
        else:
            yield b"}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94]\x94"
            yield b"}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x06frames\x94]\x94(" + frame
            yield b"h\x0b" * min(n - 1, _BATCH - 1) + b"e"  # the frame dict, repeated
            yield from _batches(n - _BATCH, b"h\x0b", b"e")
            yield b"uaau"
    else:
        raise ValueError(kind)


def write_bomb(path: Path, kind: str, n: int) -> Path:
    """A gzip-compressed protocol-4 pickle of the ``kind`` of :data:`BOMBS`, its value
    repeated ``n`` times, written a batch at a time."""
    with gzip.open(path, "wb", compresslevel=6) as out:
        out.write(b"\x80\x04")
        for part in _bomb_parts(kind, n):
            out.write(part)
        out.write(b".")
    return path


def tripped() -> dict:
    """Load arguments whose memory guard trips at the first chunk: a zero budget, and a
    resident set that grows a page each time it is read."""
    return {"memory_budget": 0, "rss": itertools.count(0, 4096).__next__}
