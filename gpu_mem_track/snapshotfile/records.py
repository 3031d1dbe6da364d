"""The memory-snapshot data model: what ``torch.cuda.memory._snapshot()`` returns, as
frozen records.

A snapshot (``Snapshot``) holds the caching allocator's segments at the moment it was
taken (``Segment``: one ``cudaMalloc``, or one expandable range, cut into ``Block``s that
tile it from its start address), and for each device the trace of the allocator's
actions recorded before that moment (``TraceEntry``; a ring buffer, so the oldest events
may be gone). Every size and address is in bytes; ``time_us`` is microseconds since the
epoch. ``Frame`` is one stack frame, Python and C++ frames mixed, innermost first.

Nothing here reads files (see ``load``) or renders. ``to_dict`` gives back the plain
shape torch writes, and ``from_dict`` reads it (``load`` checks the shape first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BLOCK_STATES",
    "TRACE_ACTIONS",
    "Block",
    "Frame",
    "Segment",
    "Snapshot",
    "TraceEntry",
]

#: Block states torch reports: in use by a tensor; freed but waiting on another stream's
#: work (``record_stream``) before it can be reused; free and cached.
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")

#: Trace actions torch records (others may appear in newer versions and are kept as is).
#: ``alloc``: a block handed out (``size`` = the request); ``free_requested``: the
#: program freed it; ``free_completed``: the allocator may reuse it; ``segment_alloc`` /
#: ``segment_free``: ``cudaMalloc`` / ``cudaFree`` of a whole segment; ``segment_map`` /
#: ``segment_unmap``: pages mapped into / out of an expandable segment; ``snapshot``: a
#: snapshot was taken; ``oom``: an allocation failed (``device_free``: the bytes the
#: driver still reported free).
TRACE_ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "user_defined",
)


@dataclass(frozen=True)
class Frame:
    """One stack frame: ``filename`` (``"??"`` or ``""`` for unresolved C++), ``line``
    (0 when unknown) and the function ``name``."""

    filename: str
    line: int
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "line": self.line, "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Frame:
        return cls(str(data.get("filename", "")), int(data.get("line") or 0), str(data.get("name", "")))


def _frames(items: Any) -> tuple[Frame, ...]:
    return tuple(Frame.from_dict(f) for f in items or ())


@dataclass(frozen=True)
class Block:
    """A piece of a segment: ``size`` bytes from ``address`` (multiple of 512),
    ``requested_size`` the bytes asked for (0 for a free block), ``state`` one of
    ``BLOCK_STATES``, ``frames`` where it was allocated (empty when not recorded)."""

    address: int
    size: int
    requested_size: int
    state: str
    frames: tuple[Frame, ...] = ()

    @property
    def allocated(self) -> bool:
        """Whether a tensor (or a pending free) still holds it."""
        return self.state != "inactive"

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "size": self.size,
            "requested_size": self.requested_size,
            "state": self.state,
            "frames": [f.to_dict() for f in self.frames],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Block:
        return cls(
            int(data["address"]),
            int(data["size"]),
            int(data.get("requested_size", data["size"])),
            str(data["state"]),
            _frames(data.get("frames")),
        )


@dataclass(frozen=True)
class Segment:
    """One segment of the allocator's cache on ``device``: ``total_size`` bytes from
    ``address``, allocated on ``stream`` for the ``segment_type`` pool (``"small"``: blocks
    of at most 1 MiB, ``"large"``), owned by the memory pool ``segment_pool_id`` ((0, 0) for
    the default pool). ``allocated_size``, ``active_size``, ``requested_size``: bytes held
    by allocated blocks, by allocated or pending-free blocks, and asked for. ``frames``:
    where the segment was allocated. ``blocks`` tile it in address order."""

    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str
    segment_pool_id: tuple[int, int] = (0, 0)
    is_expandable: bool = False
    frames: tuple[Frame, ...] = ()
    blocks: tuple[Block, ...] = ()

    @property
    def end(self) -> int:
        """The address just past the segment."""
        return self.address + self.total_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "address": self.address,
            "total_size": self.total_size,
            "allocated_size": self.allocated_size,
            "active_size": self.active_size,
            "requested_size": self.requested_size,
            "stream": self.stream,
            "segment_type": self.segment_type,
            "segment_pool_id": self.segment_pool_id,
            "is_expandable": self.is_expandable,
            "frames": [f.to_dict() for f in self.frames],
            "blocks": [b.to_dict() for b in self.blocks],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Segment:
        blocks = tuple(Block.from_dict(b) for b in data.get("blocks", ()))
        allocated = sum(b.size for b in blocks if b.state == "active_allocated")
        pool = data.get("segment_pool_id") or (0, 0)
        return cls(
            device=int(data.get("device", 0)),
            address=int(data["address"]),
            total_size=int(data["total_size"]),
            allocated_size=int(data.get("allocated_size", allocated)),
            active_size=int(data.get("active_size", allocated)),
            requested_size=int(data.get("requested_size", sum(b.requested_size for b in blocks))),
            stream=int(data.get("stream", 0)),
            segment_type=str(data.get("segment_type", "large")),
            segment_pool_id=(int(pool[0]), int(pool[1])),
            is_expandable=bool(data.get("is_expandable", False)),
            frames=_frames(data.get("frames")),
            blocks=blocks,
        )


@dataclass(frozen=True)
class TraceEntry:
    """One recorded allocator action (see ``TRACE_ACTIONS``): at ``addr`` (0 for ``oom``
    and ``snapshot``), ``size`` bytes (for ``alloc`` and the frees: the request, not the
    block; for segment actions: the segment or mapped range), on ``stream``, at
    ``time_us`` (0 when not recorded), from ``frames``. ``device_free``: for ``oom``, the
    bytes the driver reported free (None otherwise)."""

    action: str
    addr: int
    size: int
    stream: int = 0
    time_us: int = 0
    frames: tuple[Frame, ...] = ()
    device_free: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.action,
            "addr": self.addr,
            "size": self.size,
            "stream": self.stream,
            "time_us": self.time_us,
            "frames": [f.to_dict() for f in self.frames],
        }
        if self.device_free is not None:
            out["device_free"] = self.device_free
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceEntry:
        free = data.get("device_free")
        return cls(
            str(data["action"]),
            int(data.get("addr") or 0),
            int(data.get("size") or 0),
            int(data.get("stream") or 0),
            int(data.get("time_us") or 0),
            _frames(data.get("frames")),
            None if free is None else int(free),
        )


@dataclass(frozen=True)
class Snapshot:
    """A whole snapshot: ``segments`` (all devices, in torch's order), ``device_traces``
    (one tuple of entries per device index, oldest first; empty when history was not
    recorded), ``allocator_settings`` as torch reported them (empty for snapshots from
    before torch 2.5 or so), and ``source``: the file it was read from (``""`` if none)."""

    segments: tuple[Segment, ...]
    device_traces: tuple[tuple[TraceEntry, ...], ...] = ()
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def device_segments(self, device: int) -> tuple[Segment, ...]:
        """The segments of one device, in address order."""
        return tuple(sorted((s for s in self.segments if s.device == device), key=lambda s: s.address))

    def device_trace(self, device: int) -> tuple[TraceEntry, ...]:
        """The trace entries of one device, oldest first (empty when it has none)."""
        return self.device_traces[device] if device < len(self.device_traces) else ()

    def devices(self) -> tuple[int, ...]:
        """Device indexes with segments or trace entries, ascending."""
        found = {s.device for s in self.segments}
        found.update(i for i, trace in enumerate(self.device_traces) if trace)
        return tuple(sorted(found))

    def to_dict(self) -> dict[str, Any]:
        return {
            "segments": [s.to_dict() for s in self.segments],
            "device_traces": [[e.to_dict() for e in t] for t in self.device_traces],
            "allocator_settings": dict(self.allocator_settings),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> Snapshot:
        return cls(
            tuple(Segment.from_dict(s) for s in data.get("segments", ())),
            tuple(tuple(TraceEntry.from_dict(e) for e in t) for t in data.get("device_traces", ())),
            dict(data.get("allocator_settings") or {}),
            source,
        )
