"""Read a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``) safely.

A snapshot is a pickle of plain dicts, lists, strings, numbers, booleans and None,
often gzip-compressed (told by its magic bytes, whatever the file is called). It is
read with an unpickler that refuses every global, so a file asking to import anything
is rejected before anything runs. Every problem (empty, truncated, not a pickle, the
wrong shape, a missing key) raises ``errors.BadInput`` (a ``UsageError``) with one line naming the file and
the problem. Unknown keys are ignored; optional ones may be missing.

Bounded (see ``inputs``): only regular files are read, at most ``max_bytes`` of them
(default ``MAX_BYTES``), and gunzipped to at most as many (``errors.TooLarge`` past
it). The file is unpickled as a stream (``stream.SnapshotStream``: read and gunzipped a
chunk at a time as the unpickler asks, never whole in memory), so a file that is not a
pickle, such as a gzip bomb of zeros, is refused within its first chunk; no single value
(a string, a pickle frame) may be longer than ``MAX_VALUE``. After the pickle the rest
of the file is read through, keeping nothing, so the bounds and the gzip checks hold
for all of it. Every size, address and stream must lie in ``[0, 2**64)``, every time in
``[0, 2**53)`` microseconds, line numbers and devices in ``[0, 2**31)``, and the
settings nest at most ``inputs.MAX_DEPTH`` deep with integers of at most 64 bits. Names
that are not valid UTF-8 (bytes, lone surrogates) are kept with their bad bytes written
as ``\\xNN`` escapes. Every failure is ``errors.BadInput``.

Shapes accepted: the dict torch writes (``segments``, ``device_traces``,
``allocator_settings``; the last two may be absent), and a bare list of segments
(very old snapshots). A block without ``address`` gets the segment's address plus the
sizes of the blocks before it (blocks tile their segment in order); a block without
``frames`` takes them from its first ``history`` entry (torch 2.0).
"""

from __future__ import annotations

import gc
import io
import math
import os
import pickle
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, Callable, NoReturn

from .. import inputs
from ..errors import BadInput, TooLarge
from .guard import MEMORY_BUDGET, MemoryGuard, OverBudget
from .records import Block, Frame, Segment, Snapshot, TraceEntry
from .scan import scan
from .stream import SnapshotStream

__all__ = [
    "MAX_BYTES",
    "MAX_VALUE",
    "MEMORY_BUDGET",
    "load_snapshot",
    "loads_snapshot",
    "snapshot_from_data",
    "unpickle_plain",
]

_ZIP_MAGIC = b"PK\x03\x04"
_FRAME_KEYS = itemgetter("filename", "line", "name")
#: Largest snapshot read by default, on disk and after gunzip (bytes); torch's own with a
#: million trace entries pickle to a few hundred MiB. ``max_bytes`` (``--max-bytes``) sets it.
MAX_BYTES = 4 * 2**30
#: Longest single value read at once (bytes): a string, a byte string or a pickle frame.
#: A snapshot's are file and function names, and frames of about 64 KiB.
MAX_VALUE = 16 * 2**20
_U64 = 2**64
_TIME = 2**53  # microseconds: the year 2255, and exact as a float
_SMALL = 2**31


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


def unpickle_plain(
    data: bytes,
    name: str = "snapshot",
    limit: int | None = None,
    *,
    memory_budget: int | None = MEMORY_BUDGET,
    rss: Callable[[], int] | None = None,
) -> Any:
    """Unpickle ``data`` (gunzipped first, to at most ``limit`` bytes, default
    ``MAX_BYTES``, if it starts with the gzip magic) allowing only plain values; ``name``
    labels the ``BadInput`` raised on any failure. ``memory_budget`` and ``rss``: as for
    ``load_snapshot``."""
    limit = MAX_BYTES if limit is None else limit
    return _unpickle(io.BytesIO(data), name, limit, None, memory_budget, rss)


def _unpickle(
    source: BinaryIO,
    name: str,
    limit: int,
    read_limit: int | None,
    budget: int | None = None,
    rss: Callable[[], int] | None = None,
) -> Any:
    """Unpickle ``source`` (seekable, at its start) allowing only plain values. Past the
    memory ``budget`` (bytes of growth of the resident set ``rss``; None: no bound), stop,
    check the file's shape with ``scan`` (``BadInput`` if it is not a snapshot's) and
    unpickle it again with no bound."""
    if budget is not None:
        try:
            return _unpickle_once(source, name, limit, read_limit, MemoryGuard(budget, rss))
        except OverBudget:
            pass  # what the unpickler built is freed as the exception leaves it
        gc.collect()
        source.seek(0)
        scan(_stream(source, name, limit, read_limit), name, MAX_VALUE)
        source.seek(0)
    return _unpickle_once(source, name, limit, read_limit, None)


def _stream(
    source: BinaryIO, name: str, limit: int, read_limit: int | None, guard: MemoryGuard | None = None
) -> SnapshotStream:
    stream = SnapshotStream(source, name, limit=limit, read_limit=read_limit, max_read=MAX_VALUE, watch=guard)
    first = stream.peek(len(_ZIP_MAGIC))
    if not first:
        raise BadInput(
            f"{name}: empty after gunzip, not a memory snapshot"
            if stream.gzipped
            else f"{name}: empty file, not a memory snapshot"
        )
    if first[: len(_ZIP_MAGIC)] == _ZIP_MAGIC:
        raise BadInput(f"{name}: a zip archive (torch.save output?), not a memory snapshot")
    return stream


def _unpickle_once(
    source: BinaryIO, name: str, limit: int, read_limit: int | None, guard: MemoryGuard | None
) -> Any:
    """Unpickle the stream of ``source`` (see ``SnapshotStream``) allowing only plain
    values, then read the rest of it through; ``guard`` watches memory while unpickling."""
    stream = _stream(source, name, limit, read_limit, guard)
    try:
        value = _PlainUnpickler(stream).load()
    except (BadInput, OverBudget):
        raise  # the stream's own (bounds, cut gzip): already one line naming the file
    except _RefusedGlobal as exc:
        raise BadInput(f"{name}: not a memory snapshot: it asks for {exc}; refused, nothing run") from None
    except EOFError:
        raise BadInput(f"{name}: truncated pickle (ran out of data)") from None
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "truncated" in text:
            raise BadInput(f"{name}: truncated pickle ({text})") from None
        raise BadInput(f"{name}: not a pickle ({text})") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, MemoryError) as exc:
        raise BadInput(f"{name}: not a pickle ({type(exc).__name__}: {_line(exc)})") from None
    stream.watch = None
    stream.drain()
    return value


def _line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


def load_snapshot(
    path: str | Path,
    max_bytes: int | None = None,
    *,
    memory_budget: int | None = MEMORY_BUDGET,
    rss: Callable[[], int] | None = None,
) -> Snapshot:
    """Read the snapshot at ``path`` (plain or gzip-compressed pickle); ``BadInput``
    (one line) for anything but a regular file holding one, ``errors.TooLarge`` (a
    ``BadInput``) for one over ``max_bytes`` bytes (None: ``MAX_BYTES``, 4 GiB) on disk
    or once gunzipped. Once unpickling has grown the resident set (``rss()``, bytes;
    default ``guard.resident_bytes``) by ``memory_budget`` bytes (default
    ``MEMORY_BUDGET``, 512 MiB), the file's shape is checked in little memory first
    (``scan``) and it is read again only if it is a snapshot's; None: no budget."""
    limit = MAX_BYTES if max_bytes is None else max_bytes
    with inputs.open_regular(path, "a memory snapshot") as handle:
        if os.fstat(handle.fileno()).st_size > limit:
            raise TooLarge(f"{path}: larger than {limit:,} bytes, the most read as a memory snapshot")
        data = _unpickle(handle, str(path), limit, limit, memory_budget, rss)
    return snapshot_from_data(data, str(path))


def loads_snapshot(
    data: bytes,
    source: str = "snapshot",
    max_bytes: int | None = None,
    *,
    memory_budget: int | None = MEMORY_BUDGET,
    rss: Callable[[], int] | None = None,
) -> Snapshot:
    """Read a snapshot from the bytes of its file (gunzipped to at most ``max_bytes``,
    None: ``MAX_BYTES``); ``source`` names it in errors; ``memory_budget`` and ``rss``:
    as for ``load_snapshot``."""
    data_ = unpickle_plain(data, source, max_bytes, memory_budget=memory_budget, rss=rss)
    return snapshot_from_data(data_, source)


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
    return Snapshot(segments, device_traces, _settings(settings, source), source)


def _bad(source: str, problem: str) -> NoReturn:
    raise BadInput(f"{source}: not a memory snapshot: {problem}")


def _settings(settings: dict[Any, Any], source: str) -> dict[str, Any]:
    """The allocator settings, plain and bounded (``_plain``), with the values the
    allocator model reads (``allocator.settings.settings_from_snapshot``) of the types it
    reads them as, so a bad one fails here, in one line, not in the replay."""
    try:
        plain = _plain(settings, 0)
        for key, kinds in _SETTING_TYPES.items():
            if plain.get(key) is not None and not isinstance(plain[key], kinds):
                raise ValueError(f"{key!r} is a {type(plain[key]).__name__}")
        divisions = plain.get("roundup_power2_divisions")
        pairs = divisions.items() if isinstance(divisions, dict) else enumerate(divisions or ())
        for at, value in pairs:
            if isinstance(divisions, dict) and not 0 < inputs.parse_int(str(at)) < _U64:
                raise ValueError(f"roundup_power2_divisions has the key {at!r}")
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _SMALL:
                raise ValueError(f"roundup_power2_divisions has the value {value!r}")
        threshold = plain.get("garbage_collection_threshold")
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError(f"garbage_collection_threshold is {threshold}")
    except ValueError as exc:
        _bad(source, f"'allocator_settings' is malformed ({_line(exc)})")
    return plain


#: The types of the settings the allocator model reads (``settings_from_snapshot``).
_SETTING_TYPES: dict[str, Any] = {
    "PYTORCH_CUDA_ALLOC_CONF": str,
    "last_allocator_settings": str,
    "max_split_size": int,
    "roundup_power2_divisions": (dict, list),
    "expandable_segments": (bool, int),
    "garbage_collection_threshold": (int, float),
}


def _plain(value: Any, depth: int) -> Any:
    """``value`` with text made writable (``inputs.text``), integers bounded to 64 bits,
    floats finite, nesting at most ``inputs.MAX_DEPTH`` deep; ``ValueError`` otherwise."""
    if depth > inputs.MAX_DEPTH:
        raise ValueError(f"nested deeper than {inputs.MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_U64 < value < _U64:
            raise ValueError("an integer over 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a non-finite number ({value})")
        return value
    if isinstance(value, (str, bytes)):
        return inputs.text(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {inputs.text(key): _plain(item, depth + 1) for key, item in value.items()}
    raise ValueError(f"a {type(value).__name__}")


def _int(value: Any, high: int = _U64) -> int:
    """A count, size, address or time from the pickle: an int (or a whole float) in
    ``[0, high)``; ``ValueError`` otherwise (a huge or negative one, text, NaN)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(f"{_kind(value)} where an integer belongs")
    if not 0 <= value < high:
        raise ValueError("an integer out of range" if value >= 0 else f"a negative integer ({value})")
    return int(value)


def _signed(value: Any) -> int:
    """A stream (may be negative in some torch builds) within 64 bits."""
    if isinstance(value, int) and -_U64 < value < _U64:
        return int(value)
    raise ValueError(f"{_kind(value)} where a stream number belongs")


def _kind(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return "an integer over 64 bits"
    return f"a {type(value).__name__}"


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
            frame = Frame(inputs.text(filename), _int(line or 0, _SMALL), inputs.text(name))
            self._frames[key] = frame
        return frame

    def segment(self, data: dict[str, Any]) -> Segment:
        address = _int(data["address"])
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
            device=_int(data.get("device", 0), _SMALL),
            address=address,
            total_size=_int(data["total_size"]),
            allocated_size=_int(data.get("allocated_size", allocated)),
            active_size=_int(data.get("active_size", allocated)),
            requested_size=_int(data.get("requested_size", sum(b.requested_size for b in blocks))),
            stream=_signed(data.get("stream") or 0),
            segment_type=inputs.text(data.get("segment_type", "large")),
            segment_pool_id=(_signed(pool[0]), _signed(pool[1])),
            is_expandable=bool(data.get("is_expandable", False)),
            frames=self.frames(data.get("frames")),
            blocks=tuple(blocks),
        )

    def block(self, data: dict[str, Any], address: int) -> Block:
        size = _int(data["size"])
        frames = data.get("frames")
        requested = data.get("requested_size")
        history = data.get("history")
        if history and frames is None:
            frames = history[0].get("frames")
            requested = history[0].get("real_size", requested)
        return Block(
            _int(data.get("address", address)),
            size,
            _int(size if requested is None else requested),
            inputs.text(data["state"]),
            self.frames(frames),
        )

    def entry(self, data: dict[str, Any]) -> TraceEntry:
        free = data.get("device_free")
        return TraceEntry(
            inputs.text(data["action"]),
            _int(data.get("addr") or 0),
            _int(data.get("size") or 0),
            _signed(data.get("stream") or 0),
            _int(data.get("time_us") or 0, _TIME),
            self.frames(data.get("frames")),
            None if free is None else _int(free),
        )
