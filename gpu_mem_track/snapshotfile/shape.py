"""The shape of a memory snapshot, checked on summaries of values (``scan`` makes them)
rather than on the values themselves, so a file of any size is checked in little memory.

Every value the scanner meets gets a *shape* (an interned :class:`Shape`, named by its
index in :class:`Shapes`): a scalar's kind and range (an int in ``[0, 2**31)``, a
string, one of the snapshot's key names...); a dict's key names that a snapshot uses
with the shapes of their values (other keys are dropped: the loader ignores them); a
list's *roles*, the parts of a snapshot it can be, found element by element (a list is
a list of blocks while every element it got can be a block). A dict's roles follow from
its keys and values, checked against what ``load.snapshot_from_data`` reads of a
segment, a block, a trace entry, a frame, a block's history entry and the top level:
the keys it requires, the types and ranges of the values it reads (an address an int
in ``[0, 2**64)`` or a whole float, a line number under ``2**31``...), and no list or
dict under a key the loader uses elsewhere. A value that a memo reference (``GET``)
repeats has a shape of its own: only frame dicts, lists of frames and a segment's pool
id may be shared, as torch's pickles share stacks; a snapshot's other records are
each its own object. A list of more than :data:`MAX_STACK` frames (or history entries) is neither.

Being a summary, a shape cannot know a value's content beyond its kind and range (an
empty string, which fields a ``or`` lets default); where the loader accepts such a
value and the check does not, the check refuses: it is only asked about files too large
to simply load.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_SHAPES", "MAX_STACK", "Shape", "ShapeError", "Shapes"]

#: Most frames in one stack, and entries in one block's history (Python's recursion limit
#: is 1,000 by default; torch keeps a few history entries a block).
MAX_STACK = 1 << 16
#: Most distinct shapes in one file: a snapshot has a few dozen.
MAX_SHAPES = 1 << 16

# Scalar shapes: their ids are their indices in Shapes (fixed, first).
(NONE, FALSE, TRUE, INT0, INT_S, INT_T, INT_U, INT_N, INT_X) = range(9)
(FLT_S, FLT_T, FLT_U, FLT_X, STR, BYTES, BYTEARRAY) = range(9, 16)
_SCALARS = (
    "None",
    "False",
    "True",
    "an int",
    "an int",
    "an int of 2**31 or more",
    "an int of 2**53 or more",
    "a negative int",
    "an int of more than 64 bits",
    "a float",
    "a float of 2**31 or more",
    "a float of 2**53 or more",
    "a float that is no count",
    "a str",
    "a bytes",
    "a bytearray",
)
#: The key names the loader reads, each a shape of its own (a str) after the scalars.
KEYS = (
    "segments device_traces allocator_settings address total_size blocks device allocated_size "
    "active_size requested_size stream segment_type segment_pool_id is_expandable frames size "
    "state history real_size action addr time_us device_free filename line name"
).split()
KEY_IDS = {name: len(_SCALARS) + i for i, name in enumerate(KEYS)}
KEY_BYTES = {name.encode(): shape for name, shape in KEY_IDS.items()}

# Roles: what a dict can be, then what a list can be (bits).
SEG, BLOCK, ENTRY, FRAME, HIST, TOP = (1 << i for i in range(6))
SEGS, BLOCKS, TRACE, TRACES, FRAMES, HISTORY, POOL = (1 << i for i in range(6, 13))
LIST_ROLES = SEGS | BLOCKS | TRACE | TRACES | FRAMES | HISTORY
_ROLE_NAMES = {
    SEG: "a segment",
    BLOCK: "a block",
    ENTRY: "a trace entry",
    FRAME: "a frame",
    HIST: "a history entry",
    TOP: "the top level",
    SEGS: "a list of segments",
    BLOCKS: "a list of blocks",
    TRACE: "a list of trace entries",
    TRACES: "a list of traces",
    FRAMES: "a list of frames",
    HISTORY: "a list of history entries",
}
#: The role of a list's elements, by the list's role.
ELEMENT = {SEGS: SEG, BLOCKS: BLOCK, TRACE: ENTRY, TRACES: TRACE, FRAMES: FRAME, HISTORY: HIST}
_AS_ELEMENT = {SEG: SEGS, BLOCK: BLOCKS, ENTRY: TRACE, FRAME: FRAMES, HIST: HISTORY, TRACE: TRACES}

# What the loader accepts for a value (scalar shapes; see load._int, _signed, inputs.text).
_BOOLS = {FALSE, TRUE}
_FALSY = {NONE, FALSE, INT0}
U64 = _BOOLS | {INT0, INT_S, INT_T, INT_U, FLT_S, FLT_T, FLT_U}
TIME = _BOOLS | {INT0, INT_S, INT_T, FLT_S, FLT_T}
SMALL = _BOOLS | {INT0, INT_S, FLT_S}
SIGNED = _BOOLS | {INT0, INT_S, INT_T, INT_U, INT_N}
SCALAR = set(range(len(_SCALARS) + len(KEYS)))
#: Shapes below this are scalars (key names included), never a memo reference's own.
NAMED = len(SCALAR)
#: The key names' shapes.
KEY_SHAPES = frozenset(KEY_IDS.values())
#: The key names whose values the loader reads: all but ``allocator_settings`` (whose
#: value is counted as loose).
READ_KEYS = KEY_SHAPES - {KEY_IDS["allocator_settings"]}
TEXT = SCALAR

# A field: (the scalar shapes accepted, the list role accepted or 0, whether a dict is).
_F = tuple[frozenset[int], int, bool, str]


def _field(scalars: set[int], role: int = 0, desc: str = "", mapping: bool = False) -> _F:
    return frozenset(scalars), role, mapping, desc


_U64 = _field(U64, desc="an integer in [0, 2**64)")
_U64_OR = _field(U64 | {NONE}, desc="an integer in [0, 2**64)")
_SIGNED_OR = _field(SIGNED | {NONE}, desc="a stream number")
_TEXT = _field(TEXT, desc="text")
_FRAMES = _field(_FALSY, FRAMES, desc="a list of frames")
#: Per dict role: its fields, and the names of those it requires.
SPECS: dict[int, tuple[dict[str, _F], tuple[str, ...]]] = {
    SEG: (
        {
            "address": _U64,
            "total_size": _U64,
            "blocks": _field(set(), BLOCKS, desc="a list of blocks"),
            "device": _field(SMALL, desc="a device number"),
            "allocated_size": _U64,
            "active_size": _U64,
            "requested_size": _U64,
            "stream": _SIGNED_OR,
            "segment_type": _TEXT,
            "segment_pool_id": _field(_FALSY, POOL, desc="a pair of pool numbers"),
            "is_expandable": _TEXT,
            "frames": _FRAMES,
        },
        ("address", "total_size", "blocks"),
    ),
    BLOCK: (
        {
            "size": _U64,
            "state": _TEXT,
            "address": _U64,
            "requested_size": _U64_OR,
            "frames": _FRAMES,
            "history": _field(_FALSY, HISTORY, desc="a list of history entries"),
        },
        ("size", "state"),
    ),
    HIST: ({"frames": _FRAMES, "real_size": _U64_OR}, ()),
    ENTRY: (
        {
            "action": _TEXT,
            "addr": _U64_OR,
            "size": _U64_OR,
            "stream": _SIGNED_OR,
            "time_us": _field(TIME | {NONE}, desc="a time in [0, 2**53) microseconds"),
            "frames": _FRAMES,
            "device_free": _U64_OR,
        },
        ("action",),
    ),
    FRAME: (
        {"filename": _TEXT, "line": _field(SMALL | {NONE}, desc="a line number"), "name": _TEXT},
        (),
    ),
    TOP: (
        {
            "segments": _field(set(), SEGS, desc="a list of segments"),
            "device_traces": _field(_FALSY, TRACES, desc="a list of traces"),
            "allocator_settings": _field(_FALSY, 0, desc="a dict", mapping=True),
        },
        ("segments",),
    ),
}


class ShapeError(Exception):
    """The file is not a memory snapshot; the message says where (no file name)."""


class Shape:
    """One shape: ``kind`` (scalar, list, dict, shared), ``roles`` (bits it can fill),
    ``as_element`` (the list roles a list keeps when it gets this as an element),
    ``items`` (a dict's known keys with their values' shapes), ``base`` (a shared value's
    own shape) and ``name`` (for messages)."""

    __slots__ = ("as_element", "base", "items", "kind", "name", "roles")

    def __init__(self, kind: str, name: str, roles: int = 0, items: Any = None, base: int = -1) -> None:
        self.kind, self.name, self.roles, self.items, self.base = kind, name, roles, items, base
        self.as_element = 0
        for role, lists in _AS_ELEMENT.items():
            if roles & role:
                self.as_element |= lists


class Shapes:
    """The interned shapes of one file, and for each list shape the first place each of
    its lost roles was lost (for messages)."""

    def __init__(self) -> None:
        self.all: list[Shape] = [Shape("scalar", name) for name in _SCALARS]
        self.all += [Shape("scalar", "a str") for _ in KEYS]
        self._ids: dict[Any, int] = {}
        self.why: dict[int, dict[int, tuple[int, int]]] = {}

    def _intern(self, key: Any, make: Any) -> int:
        found = self._ids.get(key)
        if found is None:
            if len(self.all) >= MAX_SHAPES:
                raise ShapeError(f"more than {MAX_SHAPES:,} different shapes of values")
            found = self._ids[key] = len(self.all)
            self.all.append(make())
        return found

    def sequence(self, roles: int, kind: str, why: dict[int, tuple[int, int]]) -> int:
        """The shape of a list (or tuple, set: ``kind``) able to fill ``roles``; ``why``:
        for each list role it cannot fill, the index and shape of the element that ruled it out."""
        # The places are part of the shape, so a message names this list's own (torch's
        # lists lose their roles at their first element: few shapes).
        key = ("seq", kind, roles, frozenset(why.items()))
        shape = self._intern(key, lambda: Shape(kind, f"a {kind}", roles))
        if why and shape not in self.why:
            self.why[shape] = dict(why)
        return shape

    def mapping(self, items: dict[int, int]) -> int:
        """The shape of a dict whose known keys (shape ids) hold values of these shapes."""
        key = ("dict", frozenset(items.items()))
        return self._intern(key, lambda: self._dict(items))

    def shared(self, shape: int) -> int:
        """The shape of a memo reference to a value of ``shape`` (a container)."""
        base = self.all[shape]
        roles = base.roles & (FRAME | FRAMES | POOL)
        return self._intern(("shared", shape), lambda: Shape("shared", base.name, roles, base=shape))

    def _dict(self, items: dict[int, int]) -> Shape:
        named = {KEYS[key - len(_SCALARS)]: value for key, value in items.items()}
        roles = 0
        for role in SPECS:
            if self._problem(named, role) is None:
                roles |= role
        return Shape("dict", "a dict", roles, named)

    def _problem(self, items: dict[str, int], role: int) -> tuple[str, str] | None:
        """The first key that keeps a dict of these ``items`` from filling ``role``, and
        what is wrong with it; None when it can."""
        fields, required = SPECS[role]
        for name in required:
            if name not in items:
                return name, "missing"
        for name, value in items.items():
            field = fields.get(name)
            shape = self.all[value]
            if field is None:
                if shape.kind != "scalar":
                    return name, "unexpected"
            elif not self._fits(value, field):
                return name, "wrong"
        return None

    def _fits(self, value: int, field: _F) -> bool:
        scalars, role, mapping, _ = field
        shape = self.all[value]
        if shape.kind == "scalar":
            return value in scalars
        if mapping:
            return shape.kind == "dict"
        return bool(shape.roles & role) and (shape.kind != "dict")

    # -- messages ---------------------------------------------------------------------

    def explain_top(self, shape: int) -> str:
        """Why a file whose pickle holds a value of ``shape`` is not a memory snapshot
        (the value's roles lack the top level's)."""
        top = self.all[shape]
        if top.kind == "list":
            return self._explain_list(shape, SEGS, "segments")
        if top.kind != "dict":
            kind = "list" if top.kind == "shared" else top.name.split(" ", 1)[-1]
            return f"the pickle holds a {kind}, not a dict"
        if "segments" not in top.items:
            return "no 'segments' key at the top level"
        return self._explain_dict(shape, TOP, "")

    def _explain_dict(self, shape: int, role: int, path: str) -> str:
        items = self.all[shape].items
        name, what = self._problem(items, role) or ("", "")
        where = f"{path}.{name}" if path else name
        if what == "missing":
            return f"{path} has no {name!r} key"
        value = self.all[items[name]]
        if what == "unexpected":
            return f"{where} is {value.name}, where {_ROLE_NAMES[role]} has no list or dict"
        field = SPECS[role][0][name]
        if value.kind in ("list", "tuple", "shared") and field[1] in ELEMENT:
            return self._explain_list(items[name], field[1], where)
        return f"{where} is {value.name}, not {field[3]}"

    def _explain_list(self, shape: int, role: int, path: str) -> str:
        value = self.all[shape]
        if value.kind == "shared":
            return f"{path} repeats an earlier {value.name[2:]} (a memo reference), not {_ROLE_NAMES[role]}"
        if value.kind not in ("list", "tuple"):
            return f"{path} is {value.name}, not {_ROLE_NAMES[role]}"
        index, element = self.why.get(shape, {}).get(role, (-1, -1))
        if index < 0:
            return f"{path} holds more than {MAX_STACK:,} values, not {_ROLE_NAMES[role]}"
        where, inner = f"{path}[{index}]", self.all[element]
        need = ELEMENT[role]
        if inner.kind == "shared":
            return f"{where} repeats an earlier {inner.name[2:]} (a memo reference), not {_ROLE_NAMES[need]}"
        if inner.kind == "dict" and need != TRACE:
            return self._explain_dict(element, need, where)
        if inner.kind in ("list", "tuple") and need == TRACE:
            return self._explain_list(element, TRACE, where)
        return f"{where} is {inner.name}, not {_ROLE_NAMES[need]}"
