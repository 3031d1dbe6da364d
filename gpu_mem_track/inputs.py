"""Guarded reading of the files users hand us: snapshots, run descriptions, reports.

Every reader of such a file goes through here (or ``csvrows`` for CSV), so a case fixed
once is fixed for every command. What is guarded, and how:

- only regular files are read (``open_regular``): a FIFO, a socket or a device such as
  ``/dev/zero`` is refused before any byte is read, so nothing blocks or reads forever;
- whole-file reads are bounded in bytes (``read_bytes``), and so is gunzipping
  (``gunzip``: a small ``.gz`` may expand to gigabytes);
- JSON is bounded in bytes and nesting depth, and refuses ``NaN``/``Infinity`` and
  integers of more than ``MAX_DIGITS`` digits (``load_json``);
- numbers in text are ASCII decimals only (``parse_int``, ``parse_float``): no ``1_0``,
  no non-ASCII digits, no ``nan``/``inf`` where a finite figure belongs;
- records are checked field by field against their dataclass's declared types
  (``typed_fields``), so a wrong type is a one-line error, not a ``TypeError`` later.

Every failure raises ``errors.BadInput`` with one line naming the file and the problem.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zlib
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, BinaryIO

from .errors import BadInput, TooLarge

__all__ = [
    "MAX_DEPTH",
    "MAX_DIGITS",
    "MAX_FLOAT",
    "MAX_JSON_BYTES",
    "gunzip",
    "load_json",
    "open_regular",
    "parse_float",
    "parse_int",
    "read_bytes",
    "text",
    "typed_fields",
]

#: Longest integer read from text (decimal digits): any byte count, address or time we
#: write has at most 20; Python itself refuses to convert over 4,300.
MAX_DIGITS = 40
#: Largest magnitude of a number read from text: seconds since the epoch or since a
#: start, with room to spare (1e15 s is 30 million years); beyond it a plot's axis overflows.
MAX_FLOAT = 1e15
#: Deepest nesting read from JSON or walked in a snapshot's settings.
MAX_DEPTH = 32
#: Largest ``meta.json`` read (bytes); ours are a few KiB.
MAX_JSON_BYTES = 16 * 2**20

_MAX_BITS = int(MAX_DIGITS * 3.33)  # about MAX_DIGITS decimal digits
_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def open_regular(path: str | Path, what: str) -> BinaryIO:
    """``path`` opened for binary reading, refused (``BadInput``) unless it is a regular
    file: opened without blocking (a FIFO with no writer would wait forever), then
    checked. ``what`` names the expected content in the message ("a memory snapshot")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise BadInput(f"{path}: a directory, not {what}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise BadInput(f"{path}: {kind}, not {what}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (``TooLarge``, a
    ``BadInput``, when it holds more)."""
    with open_regular(path, what) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise TooLarge(f"{path}: larger than {limit:,} bytes, the most read as {what}")
    return data


def gunzip(data: bytes, limit: int, name: str) -> bytes:
    """``data`` (gzip, one member or several) decompressed, at most ``limit`` bytes of
    output held at any time plus one chunk (``TooLarge`` when it expands past ``limit``;
    ``BadInput`` when it is cut or corrupt)."""
    out = bytearray()
    rest = data
    while rest:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = inflate.decompress(rest, limit + 1 - len(out))
            out += chunk
            while inflate.unconsumed_tail and len(out) <= limit:
                out += inflate.decompress(inflate.unconsumed_tail, limit + 1 - len(out))
        except zlib.error as exc:
            raise BadInput(f"{name}: truncated or corrupt gzip data ({exc})") from None
        if len(out) > limit:
            raise TooLarge(f"{name}: expands past {limit:,} bytes when gunzipped: refused")
        if not inflate.eof:
            raise BadInput(f"{name}: truncated or corrupt gzip data (it ends mid-stream)")
        rest = inflate.unused_data.lstrip(b"\0")  # members may be padded with zeros
    return bytes(out)


def load_json(path: str | Path, what: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the regular file ``path`` (UTF-8, at most ``limit`` bytes,
    nested at most ``MAX_DEPTH`` deep, finite numbers, integers of at most ``MAX_DIGITS``
    digits); ``BadInput`` naming ``path`` otherwise."""
    data = read_bytes(path, limit, what)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}), not {what}") from None
    depth = _json_depth(text)
    if depth > MAX_DEPTH:
        raise BadInput(f"{path}: JSON nested deeper than {MAX_DEPTH} levels, not {what}")
    try:
        return json.loads(text, parse_constant=_no_constant, parse_int=_json_int, parse_float=_json_float)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{path}: not JSON ({_one_line(exc)}), not {what}") from None


def _json_depth(text: str) -> int:
    """The deepest nesting of brackets outside strings (a scan, so no recursion)."""
    depth = deepest = 0
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_int(text: str) -> int:
    return parse_int(text)


def _json_float(text: str) -> float:
    return parse_float(text)


def parse_int(text: str) -> int:
    """An integer from ASCII decimal ``text`` (an optional sign, then digits; at most
    ``MAX_DIGITS`` of them); ``ValueError`` otherwise (``1_0``, ``١٢``, ``1.0``)."""
    if not _INT.match(text) or len(text) > MAX_DIGITS + 1:
        raise ValueError(f"not an integer: {_short(text)}")
    return int(text)


def parse_float(text: str) -> float:
    """A number from ASCII decimal ``text`` (digits, a point, an exponent; at most
    ``2 * MAX_DIGITS`` characters), of magnitude at most ``MAX_FLOAT``; ``ValueError``
    otherwise (``nan``, ``inf``, ``1_0``, ``1e300``)."""
    if not _FLOAT.match(text) or len(text) > 2 * MAX_DIGITS:
        raise ValueError(f"not a finite number: {_short(text)}")
    value = float(text)
    if not abs(value) <= MAX_FLOAT:
        raise ValueError(f"not a finite number within {MAX_FLOAT:g}: {_short(text)}")
    return value


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def text(value: Any) -> str:
    """``value`` as text that can be written anywhere: bytes decoded as UTF-8 (bad bytes
    as ``\\xNN``), lone surrogates (from a pickle) as ``\\udcNN``."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    value = str(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def typed_fields(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """The values of ``data`` for the fields of the dataclass ``cls``, each checked
    against its declared type (``str``, ``int``, ``float``, ``bool``, ``X | None``,
    ``tuple[str, ...]``; ints bounded by ``MAX_DIGITS``, floats by ``MAX_FLOAT``); a field without
    a default must be present. ``BadInput`` (``where``: the file) naming the first bad
    field. Keys ``cls`` does not declare are ignored."""
    values: dict[str, Any] = {}
    for field in fields(cls):
        if field.name not in data:
            if field.default is MISSING and field.default_factory is MISSING:
                raise BadInput(f"{where}: no {field.name!r}")
            continue
        value = data[field.name]
        if not _fits(str(field.type), value):
            raise BadInput(f"{where}: {field.name!r} is {_kind(value)}, not {field.type}")
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return values


def _fits(annotation: str, value: Any) -> bool:
    options = [part.strip() for part in annotation.split("|")]
    if value is None:
        return "None" in options
    for option in options:
        if option == "str" and isinstance(value, str):
            return True
        if option == "bool" and isinstance(value, bool):
            return True
        if option == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value.bit_length() <= _MAX_BITS
        if option == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return abs(value) <= MAX_FLOAT
        if option.startswith("tuple[str") and isinstance(value, (list, tuple)):
            return all(isinstance(item, str) for item in value)
    return False


def _kind(value: Any) -> str:
    small = isinstance(value, int) and value.bit_length() < 64
    if value is None or small or isinstance(value, (bool, float, str)):
        shown = repr(value)
        if len(shown) <= 40:
            return shown
    return f"a {type(value).__name__}"
