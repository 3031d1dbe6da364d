"""Check and convert the plain data a memory snapshot unpickles to (``load``) into the
records of ``records``: the shapes accepted, and the bounds on each value, are those
``load``'s docstring states. Every problem raises ``errors.BadInput`` naming the
source and the place (``segments[3].blocks[0] has no 'size' key``)."""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any, Callable, NoReturn

from .. import inputs
from ..errors import BadInput
from .records import Block, Frame, Segment, Snapshot, TraceEntry

__all__ = ["line", "snapshot_from_data"]

_FRAME_KEYS = itemgetter("filename", "line", "name")
_U64 = 2**64
_TIME = 2**53  # microseconds: the year 2255, and exact as a float
_SMALL = 2**31


class _Shape(Exception):
    """A part of the data lacks a key or has a value of the wrong type."""


def line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


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
        _bad(source, f"'allocator_settings' is malformed ({line(exc)})")
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
