"""Read a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``) safely.

A snapshot is a pickle of plain dicts, lists, strings, numbers, booleans and None,
often gzip-compressed (told by its magic bytes, whatever the file is called). It is
read with an unpickler that refuses every global, so a file asking to import anything
is rejected before anything runs. Every problem (empty, truncated, not a pickle, the
wrong shape, a missing key) raises ``UsageError`` with one line naming the file and
the problem. Unknown keys are ignored; optional ones may be missing.

Shapes accepted: the dict torch writes (``segments``, ``device_traces``,
``allocator_settings``; the last two may be absent), and a bare list of segments
(very old snapshots). A block without ``address`` gets the segment's address plus the
sizes of the blocks before it (blocks tile their segment in order); a block without
``frames`` takes them from its first ``history`` entry (torch 2.0).
"""

from __future__ import annotations

import gzip
import io
import pickle
import zlib
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, NoReturn

from ..errors import UsageError
from .records import Block, Frame, Segment, Snapshot, TraceEntry

__all__ = ["load_snapshot", "loads_snapshot", "snapshot_from_data", "unpickle_plain"]

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"
_FRAME_KEYS = itemgetter("filename", "line", "name")


class _Shape(Exception):
    """A part of the data lacks a key or has a value of the wrong type."""


class _RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a global (a class or function): never allowed here."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds only plain data: every global and persistent id is refused."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise _RefusedGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise _RefusedGlobal("a persistent object")


def unpickle_plain(data: bytes, name: str = "snapshot") -> Any:
    """Unpickle ``data`` (gunzipped first if it starts with the gzip magic) allowing
    only plain values; ``name`` labels the ``UsageError`` raised on any failure."""
    if not data:
        raise UsageError(f"{name}: empty file, not a memory snapshot")
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise UsageError(f"{name}: truncated or corrupt gzip data ({exc})") from None
        if not data:
            raise UsageError(f"{name}: empty after gunzip, not a memory snapshot")
    if data[:4] == _ZIP_MAGIC:
        raise UsageError(f"{name}: a zip archive (torch.save output?), not a memory snapshot")
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as exc:
        raise UsageError(f"{name}: not a memory snapshot: it asks for {exc}; refused, nothing run") from None
    except EOFError:
        raise UsageError(f"{name}: truncated pickle (ran out of data)") from None
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "truncated" in text:
            raise UsageError(f"{name}: truncated pickle ({text})") from None
        raise UsageError(f"{name}: not a pickle ({text})") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, MemoryError) as exc:
        raise UsageError(f"{name}: not a pickle ({type(exc).__name__}: {exc})") from None


def load_snapshot(path: str | Path) -> Snapshot:
    """Read the snapshot at ``path`` (plain or gzip-compressed pickle)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise UsageError(f"{path}: a directory, not a memory snapshot") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return loads_snapshot(data, str(path))


def loads_snapshot(data: bytes, source: str = "snapshot") -> Snapshot:
    """Read a snapshot from the bytes of its file; ``source`` names it in errors."""
    return snapshot_from_data(unpickle_plain(data, source), source)


def snapshot_from_data(data: Any, source: str = "snapshot") -> Snapshot:
    """Check and convert the plain data torch pickles into a ``Snapshot``."""
    if isinstance(data, list):
        data = {"segments": data}
    if not isinstance(data, dict):
        _bad(source, f"the pickle holds a {type(data).__name__}, not a dict")
    if "segments" not in data:
        _bad(source, "no 'segments' key at the top level")
    reader = _Reader(source)
    segments = reader.many(data["segments"], "segments", reader.segment)
    traces = _list(data.get("device_traces") or (), source)
    device_traces = tuple(reader.many(t, f"device_traces[{i}]", reader.entry) for i, t in enumerate(traces))
    settings = data.get("allocator_settings") or {}
    if not isinstance(settings, dict):
        _bad(source, "'allocator_settings' is not a dict")
    return Snapshot(segments, device_traces, dict(settings), source)


def _bad(source: str, problem: str) -> NoReturn:
    raise UsageError(f"{source}: not a memory snapshot: {problem}")


def _list(value: Any, source: str, where: str = "device_traces") -> list[Any]:
    if not isinstance(value, (list, tuple)):
        _bad(source, f"'{where}' is a {type(value).__name__}, not a list")
    return list(value)


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"has no {exc.args[0]!r} key"
    return f"is malformed ({type(exc).__name__}: {exc})"


class _Reader:
    """Converts one snapshot's plain data, sharing identical stacks between records
    (a trace repeats a few hundred stacks thousands of times)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._stacks: dict[tuple[int, ...], tuple[Frame, ...]] = {}
        self._frames: dict[tuple[Any, Any, Any], Frame] = {}
        self._lists: dict[int, tuple[Any, tuple[Frame, ...]]] = {}
        self._dicts: dict[int, tuple[Any, Frame]] = {}

    def many(self, items: Any, where: str, convert: Callable[[Any], Any]) -> tuple[Any, ...]:
        out = []
        for i, item in enumerate(_list(items, self.source, where)):
            try:
                out.append(convert(item))
            except _Shape as exc:
                _bad(self.source, f"{where}[{i}].{exc}")
            except Exception as exc:  # any malformed value is the file's fault
                _bad(self.source, f"{where}[{i}] {_describe(exc)}")
        return tuple(out)

    def frames(self, items: Any) -> tuple[Frame, ...]:
        if not items:
            return ()
        # torch's pickles share one list among the entries with the same stack.
        seen = self._lists.get(id(items))
        if seen is not None and seen[0] is items:
            return seen[1]
        stack = self._stack(items)
        self._lists[id(items)] = (items, stack)
        return stack

    def _stack(self, items: Any) -> tuple[Frame, ...]:
        # torch's pickles also share each frame dict among stacks: convert each once.
        by_dict, frames = self._dicts, []
        for item in items:
            known = by_dict.get(id(item))
            if known is None or known[0] is not item:
                known = by_dict[id(item)] = (item, self._frame(item))
            frames.append(known[1])
        key = tuple(map(id, frames))  # equal frames are one object (``_frame``)
        stack = self._stacks.get(key)
        if stack is None:
            stack = self._stacks[key] = tuple(frames)
        return stack

    def _frame(self, item: Any) -> Frame:
        """The one ``Frame`` for a frame dict's values (equal dicts give the same object)."""
        try:
            key = _FRAME_KEYS(item)
        except KeyError:
            key = (item.get("filename", ""), item.get("line", 0), item.get("name", ""))
        frame = self._frames.get(key)
        if frame is None:
            filename, line, name = key
            frame = self._frames[key] = Frame(str(filename), int(line or 0), str(name))
        return frame

    def segment(self, data: dict[str, Any]) -> Segment:
        address = int(data["address"])
        blocks = []
        at = address
        for i, b in enumerate(data["blocks"]):
            try:
                block = self.block(b, at)
            except Exception as exc:
                raise _Shape(f"blocks[{i}] {_describe(exc)}") from None
            blocks.append(block)
            at = block.address + block.size
        allocated = sum(b.size for b in blocks if b.state == "active_allocated")
        pool = data.get("segment_pool_id") or (0, 0)
        return Segment(
            device=int(data.get("device", 0)),
            address=address,
            total_size=int(data["total_size"]),
            allocated_size=int(data.get("allocated_size", allocated)),
            active_size=int(data.get("active_size", allocated)),
            requested_size=int(data.get("requested_size", sum(b.requested_size for b in blocks))),
            stream=int(data.get("stream") or 0),
            segment_type=str(data.get("segment_type", "large")),
            segment_pool_id=(int(pool[0]), int(pool[1])),
            is_expandable=bool(data.get("is_expandable", False)),
            frames=self.frames(data.get("frames")),
            blocks=tuple(blocks),
        )

    def block(self, data: dict[str, Any], address: int) -> Block:
        size = int(data["size"])
        frames = data.get("frames")
        requested = data.get("requested_size")
        history = data.get("history")
        if history and frames is None:
            frames = history[0].get("frames")
            requested = history[0].get("real_size", requested)
        return Block(
            int(data.get("address", address)),
            size,
            int(size if requested is None else requested),
            str(data["state"]),
            self.frames(frames),
        )

    def entry(self, data: dict[str, Any]) -> TraceEntry:
        free = data.get("device_free")
        return TraceEntry(
            str(data["action"]),
            int(data.get("addr") or 0),
            int(data.get("size") or 0),
            int(data.get("stream") or 0),
            int(data.get("time_us") or 0),
            self.frames(data.get("frames")),
            None if free is None else int(free),
        )
