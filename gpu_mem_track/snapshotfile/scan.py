"""Check that a pickle has the shape of a memory snapshot while building nothing of it:
an interpreter of pickle opcodes (as ``pickletools.genops`` reads them) over a
``SnapshotStream`` that keeps, for every value, only its shape (``shape.Shapes``).

The loader calls it on a file whose unpickling grew past its memory budget
(``guard``), before loading it again: a file refused here costs little memory however
large it would unpack. The scanner's memory is bounded whatever the file holds: a
byte per memo entry (and at most one entry per :data:`MEMO_BYTES` bytes of pickle past
the first :data:`MEMO_FREE`: torch's pickles take 31-89 bytes per entry), the values
on the stack not yet put in a container (at most :data:`MAX_PENDING`; pickle puts them
in by the thousand), and the containers not yet closed (at most :data:`MAX_OPEN`).
Values that no part of a snapshot's records reads (under keys the loader ignores, in
the allocator settings, in lists of anything but records) count as *loose*: more than
:data:`MAX_LOOSE` of them, as in a list of 200 million zeros, are refused as soon as
they are seen. Pickles are read as Python's pickler writes plain data: a container is
filled while it is on the stack, never through a memo reference, and never holds
itself; ``DUP`` and every opcode that names a global or a persistent id are refused.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..errors import BadInput
from . import shape as sh
from .scanops import Node as _Node
from .scanops import run
from .stream import SnapshotStream

__all__ = ["MAX_LOOSE", "MAX_OPEN", "MAX_PENDING", "MEMO_BYTES", "MEMO_FREE", "scan"]

#: Most values outside a snapshot's records (settings, unknown keys, lists of scalars).
MAX_LOOSE = 1 << 20
#: Most values waiting on the stack to be put in a container (pickle batches 1,000).
MAX_PENDING = 1 << 20
#: Most containers open at once (nesting, and the elements of the batches being read).
MAX_OPEN = 1 << 17
#: Memo entries allowed before the ratio below applies, and the fewest bytes of pickle
#: per memo entry after that.
MEMO_FREE, MEMO_BYTES = 1 << 24, 16
_BLOCK = 1 << 20  # bytes asked of the stream at a time
_PAD = bytes(16)
_OPEN, _WIDE = 1, 255  # memo codes: 0 unset, 1 an open container, 2.. a shape id + 2


def scan(stream: SnapshotStream, name: str, max_value: int) -> None:
    """Read ``stream`` (a pickle) to its ``STOP``; ``BadInput`` naming ``name`` and the
    place unless it has the shape of a memory snapshot. ``max_value``: the longest single
    value (string, frame) allowed, as for the unpickler."""
    _Scanner(stream, name, max_value).run()


class _Scanner:
    def __init__(self, stream: SnapshotStream, name: str, max_value: int) -> None:
        self.stream, self.name, self.max_value = stream, name, max_value
        self.shapes = sh.Shapes()
        self.memo = bytearray()
        self.memo_len = 0
        self.wide: dict[int, int] = {}
        self.open_memo: dict[int, _Node] = {}  # memo entries of containers not yet closed
        self.shared: dict[int, int] = {}
        self.loose = 0
        self.open = 0
        self.eof = False
        self.base = 0  # bytes of the pickle before buf[0]
        self.read = 0
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.empty_tuple = self.shapes.sequence(sh.LIST_ROLES, "tuple", {})
        self.buf, self.pos, self.avail = b"", 0, 0  # the rare opcodes' view of the buffer

    # -- failing ------------------------------------------------------------------------

    def fail(self, problem: str) -> NoReturn:
        raise BadInput(f"{self.name}: not a memory snapshot: {problem}")

    def not_pickle(self, problem: str) -> NoReturn:
        raise BadInput(f"{self.name}: not a pickle ({problem})")

    def truncated(self) -> NoReturn:
        raise BadInput(f"{self.name}: truncated pickle (ran out of data)")

    def too_long(self, n: int) -> NoReturn:
        self.fail(f"it holds a single value of {n:,} bytes at once (at most {self.max_value:,} read at once)")

    # -- reading ------------------------------------------------------------------------

    def refill(self, buf: bytes, pos: int, avail: int, n: int, least: int = 0) -> tuple[bytes, int, int]:
        """``buf`` from ``pos`` with at least ``n`` bytes of data (at the end of the data,
        ``least`` will do: else the pickle is cut short), padded at the end so fixed-size
        arguments can be read without checks; returns it with its data's length."""
        rest = buf[pos:avail]
        self.base += pos
        while len(rest) < n and not self.eof:
            more = self.stream.read(min(_BLOCK, self.max_value))
            self.read += len(more)
            self.eof = not more
            rest += more
            self.check_bounds()
        if len(rest) < (least or n) or not rest:
            self.truncated()
        return (rest + _PAD if self.eof else rest), 0, len(rest)

    def check_bounds(self) -> None:
        if self.memo_len > max(MEMO_FREE, self.read // MEMO_BYTES):
            self.fail(f"{self.memo_len:,} memo entries in {self.read:,} bytes, far more than a snapshot has")
        if len(self.metastack) > MAX_OPEN:  # marks: containers begun, each an empty list here
            self.fail(f"more than {MAX_OPEN:,} containers open at once, as no snapshot's pickle has")
        pending = len(self.stack) + sum(map(len, self.metastack))
        if pending > MAX_PENDING:
            self.fail(
                f"more than {MAX_PENDING:,} values not yet in any container, as no snapshot's pickle has"
            )

    # -- values ---------------------------------------------------------------------------

    def close(self, value: Any) -> tuple[int, int, int]:
        """The shape, weight and loose count of a value on the stack (closing it when it
        is a container)."""
        if type(value) is int:
            return value, 0, 0
        node: _Node = value
        self.open -= 1
        shape = self.freeze(node)
        for index in node.memo:
            self.open_memo.pop(index, None)
        return shape, node.weight, node.counted

    def freeze(self, node: _Node) -> int:
        """The shape of ``node`` as it is now, written to its memo entries; it may not
        change after this (its memo entries may be read)."""
        if node.frozen >= 0:
            return node.frozen
        if node.kind == "dict":
            shape = self.shapes.mapping(node.items)
        else:
            roles = node.roles if node.kind != "set" else 0
            if node.pool == 2:
                roles |= sh.POOL
            shape = self.shapes.sequence(roles, node.kind, node.why)
        node.frozen = shape
        for index in node.memo:
            self.set_memo(index, shape)
        return shape

    def set_memo(self, index: int, shape: int) -> None:
        """Memo entry ``index`` holds a value of shape ``shape`` (its code: the shape + 2,
        or ``_WIDE`` with the shape in ``wide``)."""
        if shape + 2 < _WIDE:
            self.memo[index] = shape + 2
        else:
            self.memo[index], self.wide[index] = _WIDE, shape

    def new(self, kind: str) -> _Node:
        self.open += 1
        if self.open > MAX_OPEN:
            self.fail(f"more than {MAX_OPEN:,} containers open at once, as no snapshot's pickle has")
        return _Node(kind)

    def add_loose(self, n: int) -> None:
        self.loose += n
        if self.loose > MAX_LOOSE:
            self.fail(
                f"more than {MAX_LOOSE:,} values outside its records (lists of anything but records, "
                f"unknown keys, settings) within its first {self.read:,} bytes"
            )

    def append(self, node: Any, value: Any) -> None:
        if type(node) is not _Node or node.kind == "dict":
            self.not_pickle("APPEND to something that is not a list")
        if node.frozen >= 0:
            self.fail("a list changed after a memo reference repeated it, as no snapshot's pickle does")
        shape, weight, counted = self.close(value)
        node.length += 1
        if node.length <= 2 and shape in sh.SIGNED:
            node.pool += 1
        roles = node.roles
        if roles:
            keep = roles & self.shapes.all[shape].as_element
            if node.length > sh.MAX_STACK:  # a stack, a block's history: never this long
                keep &= ~(sh.FRAMES | sh.HISTORY)
                for bit in (sh.FRAMES, sh.HISTORY):
                    if roles & bit:
                        node.why[bit] = (-1, -1)
            if keep != roles:
                for bit in sh.ELEMENT:
                    if roles & bit and not keep & bit and bit not in node.why:
                        node.why[bit] = (node.length - 1, shape)
                node.roles = keep
                if not keep:  # from here on, nothing in it can be a record
                    self.add_loose(node.weight - node.counted)
                    node.counted = node.weight
        node.weight += 1 + weight
        if node.roles:
            node.counted += counted
        else:
            self.add_loose(1 + weight - counted)
            node.counted += 1 + weight

    def setitem(self, node: Any, key: Any, value: Any) -> None:
        if type(node) is not _Node or node.kind != "dict":
            self.not_pickle("SETITEM on something that is not a dict")
        if node.frozen >= 0:
            self.fail("a dict changed after a memo reference repeated it, as no snapshot's pickle does")
        if type(key) is not int or self.shapes.all[key].kind != "scalar":
            self.fail("a dict key that is a list, tuple or dict")
        shape, weight, counted = self.close(value)
        node.weight += 1 + weight
        if key in sh.KEY_SHAPES:
            node.items[key] = shape
        if key in sh.READ_KEYS:
            node.counted += counted
            return
        self.add_loose(1 + weight - counted)
        node.counted += 1 + weight

    def discard(self, value: Any) -> None:
        shape, weight, counted = self.close(value)
        self.add_loose(1 + weight - counted)

    def memo_put(self, index: int) -> None:
        if not self.stack:
            self.not_pickle("memo put with an empty stack")
        if index >= len(self.memo):
            if index > len(self.memo) + MAX_PENDING:
                self.fail(f"memo index {index:,} far past the entries so far, as no snapshot's pickle has")
            self.memo += bytes(index + 1 - len(self.memo))
        if not self.memo[index]:
            self.memo_len += 1
        self.wide.pop(index, None)
        value = self.stack[-1]
        self.open_memo.pop(index, None)
        if type(value) is _Node:
            if value.frozen >= 0:
                self.set_memo(index, value.frozen)
                return
            value.memo.append(index)
            self.memo[index] = _OPEN
            self.open_memo[index] = value
        else:
            self.set_memo(index, value)

    def memo_get(self, index: int) -> int:
        code = self.memo[index] if index < len(self.memo) else 0
        if code == 0:
            self.not_pickle(f"Memo value not found at index {index}")
        if code == _OPEN:  # a container complete but not yet in its own (a batch's)
            shape = self.freeze(self.open_memo[index])
        else:
            shape = code - 2 if code != _WIDE else self.wide[index]
        if shape < sh.NAMED:
            return shape
        shared = self.shared.get(shape)
        if shared is None:
            base = self.shapes.all[shape]
            shared = self.shared[shape] = shape if base.kind == "shared" else self.shapes.shared(shape)
        return shared

    def sequence(self, kind: str, items: list[Any]) -> _Node:
        node = self.new(kind)
        for item in items:
            self.append(node, item)
        return node

    def run(self) -> None:
        try:
            top = run(self)
        except IndexError:  # a pop from an empty stack
            self.not_pickle("unpickling stack underflow")
        except sh.ShapeError as exc:
            self.fail(str(exc))
        shape = self.close(top)[0]
        value = self.shapes.all[shape]
        fits = value.roles & sh.TOP if value.kind == "dict" else value.roles & sh.SEGS
        if value.kind in ("list", "dict") and fits:  # a bare list of segments, as the loader
            return
        self.fail(self.shapes.explain_top(shape))
