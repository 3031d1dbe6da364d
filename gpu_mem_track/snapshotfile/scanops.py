"""The opcode loop of ``scan``: reads each pickle opcode and its argument and does to
the scanner's stack what ``pickle.Unpickler`` does to its own, with shapes for values.
The commonest opcodes of torch's snapshots (memo gets, ints, short strings, dicts and
lists filled in batches) are handled here; the rest by ``rareops``."""

from __future__ import annotations

from struct import Struct
from typing import Any

from . import shape as sh
from .rareops import RARE, Node, int_shape, text_shape

#: ``scan._Scanner`` (not imported: it imports this module).
_Scanner = Any

__all__ = ["Node", "run"]

_u32 = Struct("<I").unpack_from
_i32 = Struct("<i").unpack_from


def run(s: _Scanner) -> Any:  # noqa: C901 - one loop, as the unpickler's
    """Interpret the pickle of ``s.stream`` up to ``STOP``; return the value it stops
    with (a shape id or an open container)."""
    buf, pos, avail = s.refill(b"", 0, 0, 1)
    safe = avail - (1 if s.eof else 16)
    memo_get, append, setitem = s.memo_get, s.append, s.setitem
    key_bytes, u32, memo, named, known = sh.KEY_BYTES, _u32, s.memo, sh.NAMED + 2, sh.READ_KEYS
    max_stack = sh.MAX_STACK
    stack = s.stack
    push = stack.append
    while True:
        if pos > safe:
            buf, pos, avail = s.refill(buf, pos, avail, 16, 1)
            safe = avail - (1 if s.eof else 16)
        op = buf[pos]
        pos += 1
        if op == 0x6A or op == 0x68:  # LONG_BINGET, BINGET
            if op == 0x6A:
                index = u32(buf, pos)[0]
                pos += 4
            else:
                index = buf[pos]
                pos += 1
            code = memo[index] if index < len(memo) else 0
            push(code - 2 if 2 <= code < named else memo_get(index))  # a string: as is
        elif op == 0x94:  # MEMOIZE
            value = stack[-1] if stack else None
            if type(value) is int and value + 2 < named and s.memo_len == len(memo):
                memo.append(value + 2)
                s.memo_len += 1
            else:
                s.memo_put(s.memo_len)
        elif op == 0x28:  # MARK
            s.metastack.append(stack)
            stack = s.stack = []
            push = stack.append
        elif op == 0x4B:  # BININT1
            push(sh.INT_S if buf[pos] else sh.INT0)
            pos += 1
        elif op == 0x8A:  # LONG1
            n = buf[pos]
            pos += 1
            if pos + n > avail:
                buf, pos, avail = s.refill(buf, pos, avail, n)
                safe = avail - (1 if s.eof else 16)
            push(int_shape(int.from_bytes(buf[pos : pos + n], "little", signed=True)))
            pos += n
        elif op == 0x8C:  # SHORT_BINUNICODE
            n = buf[pos]
            pos += 1
            if pos + n > avail:
                buf, pos, avail = s.refill(buf, pos, avail, n)
                safe = avail - (1 if s.eof else 16)
            raw = buf[pos : pos + n]
            push(key_bytes.get(raw, sh.STR) if raw.isascii() else text_shape(raw, s))
            pos += n
        elif op == 0x7D:  # EMPTY_DICT
            push(s.new("dict"))
        elif op == 0x5D:  # EMPTY_LIST
            push(s.new("list"))
        elif op == 0x75 or op == 0x65:  # SETITEMS, APPENDS
            if not s.metastack:
                s.not_pickle("could not find MARK")
            items = stack
            stack = s.stack = s.metastack.pop()
            push = stack.append
            if not stack:
                s.not_pickle("no container for the items")
            target = stack[-1]
            if op == 0x65:
                if type(target) is Node and target.kind == "list" and target.frozen < 0:
                    shapes = s.shapes.all
                    for item in items:
                        roles, n = target.roles, target.length
                        # A scalar or memo reference that keeps every role the list has:
                        # only the count changes (append() does the rest).
                        if (
                            type(item) is int
                            and 2 <= n < max_stack
                            and roles
                            and shapes[item].as_element & roles == roles
                        ):
                            target.length = n + 1
                            target.weight += 1
                        else:
                            append(target, item)
                else:
                    for item in items:
                        append(target, item)
            elif len(items) % 2:
                s.not_pickle("odd number of items for SETITEMS")
            elif type(target) is Node and target.kind == "dict" and target.frozen < 0:
                into, done = target.items, 0
                for i in range(0, len(items), 2):
                    key, value = items[i], items[i + 1]
                    if type(value) is int and key in known:  # a scalar under a key read
                        into[key] = value
                        done += 1
                    else:
                        setitem(target, key, value)
                target.weight += done
            else:
                setitem(target, items[0] if items else None, items[1] if items else None)
        elif op == 0x4A:  # BININT
            push(int_shape(_i32(buf, pos)[0]))
            pos += 4
        elif op == 0x4D:  # BININT2
            push(sh.INT_S if buf[pos] or buf[pos + 1] else sh.INT0)
            pos += 2
        elif op == 0x89:  # NEWFALSE
            push(sh.FALSE)
        elif op == 0x88:  # NEWTRUE
            push(sh.TRUE)
        elif op == 0x4E:  # NONE
            push(sh.NONE)
        elif op == 0x2E:  # STOP
            if not stack:
                s.not_pickle("STOP with an empty stack")
            return stack.pop()
        else:
            handler = RARE.get(op)
            if handler is None:
                s.not_pickle(f"invalid load key, {chr(op)!r}.")
            s.buf, s.pos, s.avail = buf, pos, avail
            handler(s)
            buf, pos, avail = s.buf, s.pos, s.avail
            safe = avail - (1 if s.eof else 16)
            stack = s.stack
            push = stack.append
