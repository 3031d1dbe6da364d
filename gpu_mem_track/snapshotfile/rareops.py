"""The pickle opcodes a snapshot's pickle seldom or never holds, for ``scanops``: each
reads its argument through the scanner's ``buf``/``pos`` view and does what
``pickle.Unpickler`` does to its stack, with shapes for values; those that name a
global, a persistent id or out-of-band data are refused. Also the scanner's open
container (:class:`Node`) and the shapes of scalars."""

from __future__ import annotations

import codecs
from struct import Struct
from typing import Any, Callable

from . import shape as sh

#: ``scan._Scanner`` (not imported: it imports this module).
_Scanner = Any

__all__ = ["RARE", "Node", "float_shape", "int_shape", "text_shape"]

_u32 = Struct("<I").unpack_from
_i32 = Struct("<i").unpack_from
_u64 = Struct("<Q").unpack_from
_f64 = Struct(">d").unpack_from


class Node:
    """An open container: its kind, the roles it can still fill (lists) or its known
    keys' shapes (dicts), and how many values it holds (``weight``, all levels)."""

    __slots__ = ("counted", "frozen", "items", "kind", "length", "memo", "pool", "roles", "weight", "why")

    def __init__(self, kind: str) -> None:
        self.kind, self.roles, self.length, self.weight, self.counted, self.pool = kind, 0, 0, 0, 0, 0
        self.items: dict[int, int] = {}
        self.why: dict[int, tuple[int, int]] = {}
        self.memo: list[int] = []
        self.frozen = -1  # its shape once a memo reference repeated it: it may not change then
        if kind in ("list", "tuple"):
            self.roles = sh.LIST_ROLES


def int_shape(value: int) -> int:
    if value == 0:
        return sh.INT0
    if value < 0:
        return sh.INT_N if value > -(2**64) else sh.INT_X
    if value < 2**31:
        return sh.INT_S
    if value < 2**53:
        return sh.INT_T
    return sh.INT_U if value < 2**64 else sh.INT_X


def float_shape(value: float) -> int:
    if not (value >= 0 and value.is_integer()):
        return sh.FLT_X
    if value < 2**31:
        return sh.FLT_S
    if value < 2**53:
        return sh.FLT_T
    return sh.FLT_U if value < 2**64 else sh.FLT_X


def text_shape(raw: bytes, s: _Scanner, codec: str = "utf-8") -> int:
    """The shape of a string pickled as ``raw`` (a key name's own, else ``STR``); as the
    unpickler, refuses bytes that do not decode."""
    if not raw.isascii():
        try:
            raw.decode(codec, "surrogatepass" if codec == "utf-8" else "strict")
        except UnicodeDecodeError as exc:
            s.not_pickle(f"UnicodeDecodeError: {exc.reason} at byte {exc.start}")
        return sh.STR
    return sh.KEY_BYTES.get(raw, sh.STR)


# -- the rare opcodes: each reads its argument through the scanner's s.buf/s.pos ---------


def _take(s: _Scanner, n: int) -> bytes:
    if n > s.max_value:
        s.too_long(n)
    if s.pos + n > s.avail:
        s.buf, s.pos, s.avail = s.refill(s.buf, s.pos, s.avail, n)
    out = s.buf[s.pos : s.pos + n]
    s.pos += n
    return out


def _line(s: _Scanner) -> bytes:
    """The next line, without its newline (protocol 0's arguments)."""
    searched = 0
    while True:
        end = s.buf.find(b"\n", s.pos + searched, s.avail)
        if end >= 0:
            out, s.pos = s.buf[s.pos : end], end + 1
            return out
        searched = s.avail - s.pos
        if searched > s.max_value:
            s.too_long(searched)
        if s.eof:
            s.truncated()
        s.buf, s.pos, s.avail = s.refill(s.buf, s.pos, s.avail, searched + 1)


def _proto(s: _Scanner) -> None:
    _take(s, 1)


def _frame(s: _Scanner) -> None:
    """FRAME: the unpickler reads the frame whole, so it is bounded as one value."""
    n = _u64(_take(s, 8))[0]
    if n > s.max_value:
        s.too_long(n)


def _number(s: _Scanner, text: bytes, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError as exc:
        s.not_pickle(f"ValueError: {exc}")


def _mark(s: _Scanner) -> list[Any]:
    """The values since the last MARK, dropping the mark."""
    if not s.metastack:
        s.not_pickle("could not find MARK")
    items = s.stack
    s.stack = s.metastack.pop()
    return items


def _int_line(s: _Scanner) -> None:
    text = _line(s)
    flags = {b"00": sh.FALSE, b"01": sh.TRUE}
    s.stack.append(flags[text] if text in flags else int_shape(_number(s, text, int)))


def _long4(s: _Scanner) -> None:
    n = _i32(_take(s, 4))[0]
    if n < 0:
        s.not_pickle("LONG pickle has negative byte count")
    s.stack.append(int_shape(int.from_bytes(_take(s, n), "little", signed=True)))


def _sized(size: int, shape: int | None, codec: str = "utf-8") -> Callable[[_Scanner], None]:
    """A string or bytes opcode with a ``size``-byte length (1, 4 or 8 bytes)."""

    def handle(s: _Scanner) -> None:
        raw = _take(s, size)
        n = raw[0] if size == 1 else (_u32(raw)[0] if size == 4 else _u64(raw)[0])
        if codec == "ascii" and size == 4:
            n = _i32(raw)[0]
            if n < 0:
                s.not_pickle("BINSTRING pickle has negative byte count")
        data = _take(s, n)
        s.stack.append(shape if shape is not None else text_shape(data, s, codec))

    return handle


def _string(s: _Scanner) -> None:
    text = _line(s)
    if len(text) < 2 or text[0] != text[-1] or text[:1] not in (b"'", b'"'):
        s.not_pickle("the STRING opcode argument must be quoted")
    try:
        raw = codecs.escape_decode(text[1:-1])[0]
    except ValueError as exc:
        s.not_pickle(f"ValueError: {exc}")
    s.stack.append(text_shape(raw, s, "ascii"))


def _unicode(s: _Scanner) -> None:
    try:
        text = _line(s).decode("raw-unicode-escape")
    except UnicodeDecodeError as exc:
        s.not_pickle(f"UnicodeDecodeError: {exc.reason}")
    s.stack.append(sh.KEY_BYTES.get(text.encode("utf-8", "surrogatepass"), sh.STR))


def _float_line(s: _Scanner) -> None:
    s.stack.append(float_shape(_number(s, _line(s), float)))


def _tuple(n: int) -> Callable[[_Scanner], None]:
    def handle(s: _Scanner) -> None:
        if len(s.stack) < n:
            s.not_pickle("unpickling stack underflow")
        items = s.stack[len(s.stack) - n :]
        del s.stack[len(s.stack) - n :]
        s.stack.append(s.sequence("tuple", items))

    return handle


def _from_mark(kind: str) -> Callable[[_Scanner], None]:
    """TUPLE, LIST, DICT, FROZENSET: a container of the values since the last MARK."""

    def handle(s: _Scanner) -> None:
        items = _mark(s)
        if kind != "dict":
            s.stack.append(s.sequence(kind, items))
            return
        if len(items) % 2:
            s.not_pickle("odd number of items for DICT")
        node = s.new("dict")
        for i in range(0, len(items), 2):
            s.setitem(node, items[i], items[i + 1])
        s.stack.append(node)

    return handle


def _additems(s: _Scanner) -> None:
    items = _mark(s)
    target = s.stack[-1] if s.stack else None
    if getattr(target, "kind", None) != "set":
        s.not_pickle("ADDITEMS to something that is not a set")
    for item in items:
        s.append(target, item)


def _append(s: _Scanner) -> None:
    value = s.stack.pop()
    s.append(s.stack[-1] if s.stack else None, value)


def _setitem(s: _Scanner) -> None:
    value, key = s.stack.pop(), s.stack.pop()
    s.setitem(s.stack[-1] if s.stack else None, key, value)


def _pop(s: _Scanner) -> None:
    if s.stack:
        s.discard(s.stack.pop())
    else:
        _mark(s)


def _pop_mark(s: _Scanner) -> None:
    for item in _mark(s):
        s.discard(item)


def _refuse(problem: str) -> Callable[[_Scanner], None]:
    def handle(s: _Scanner) -> None:
        s.fail(problem)

    return handle


def _global(s: _Scanner) -> None:
    module, name = _line(s), _line(s)
    text = f"{module.decode('utf-8', 'backslashreplace')}.{name.decode('utf-8', 'backslashreplace')}"
    s.fail(f"it asks for {text}; refused, nothing run")


def _unused(name: str) -> Callable[[_Scanner], None]:
    def handle(s: _Scanner) -> None:
        s.not_pickle(f"opcode {name}, which a pickle of plain data never holds")

    return handle


_GLOBAL = _refuse("it asks for a global; refused, nothing run")
_PERSISTENT = _refuse("it asks for a persistent object; refused, nothing run")
RARE: dict[int, Callable[[_Scanner], None]] = {
    0x80: _proto,
    0x95: _frame,
    ord("G"): lambda s: s.stack.append(float_shape(_f64(_take(s, 8))[0])),
    ord("F"): _float_line,
    ord("I"): _int_line,
    ord("L"): lambda s: s.stack.append(int_shape(_number(s, _line(s).rstrip(b"L"), int))),
    0x8B: _long4,
    ord("X"): _sized(4, None),
    0x8D: _sized(8, None),
    ord("T"): _sized(4, None, "ascii"),
    ord("U"): _sized(1, None, "ascii"),
    ord("B"): _sized(4, sh.BYTES),
    ord("C"): _sized(1, sh.BYTES),
    0x8E: _sized(8, sh.BYTES),
    0x96: _sized(8, sh.BYTEARRAY),
    ord("S"): _string,
    ord("V"): _unicode,
    ord(")"): lambda s: s.stack.append(s.empty_tuple),
    ord("t"): _from_mark("tuple"),
    ord("l"): _from_mark("list"),
    ord("d"): _from_mark("dict"),
    0x91: _from_mark("set"),
    0x85: _tuple(1),
    0x86: _tuple(2),
    0x87: _tuple(3),
    0x8F: lambda s: s.stack.append(s.new("set")),
    0x90: _additems,
    ord("a"): _append,
    ord("s"): _setitem,
    ord("0"): _pop,
    ord("1"): _pop_mark,
    ord("2"): _refuse("it uses DUP, which no snapshot's pickle does"),
    ord("g"): lambda s: s.stack.append(s.memo_get(_number(s, _line(s), int))),
    ord("p"): lambda s: s.memo_put(_number(s, _line(s), int)),
    ord("q"): lambda s: s.memo_put(_take(s, 1)[0]),
    ord("r"): lambda s: s.memo_put(_u32(_take(s, 4))[0]),
    ord("c"): _global,
    ord("i"): _global,
    0x93: _GLOBAL,
    0x82: _GLOBAL,
    0x83: _GLOBAL,
    0x84: _GLOBAL,
    ord("P"): _PERSISTENT,
    ord("Q"): _PERSISTENT,
    ord("R"): _unused("REDUCE"),
    ord("b"): _unused("BUILD"),
    ord("o"): _unused("OBJ"),
    0x81: _unused("NEWOBJ"),
    0x92: _unused("NEWOBJ_EX"),
    0x97: _unused("NEXT_BUFFER"),
    0x98: _unused("READONLY_BUFFER"),
}
