"""The loops of a source file, read with ``ast``: where each ends, where a ``break`` of it
would go on, and how many iterations a ``for`` loop has left.

The stop rule (``steady``) leaves a loop as a ``break`` would by moving the frame to the
line a ``break`` goes to (``frame.f_lineno``, set from the line event of the loop's
header: CPython allows a jump out of ``for`` and ``while`` loops there, and pops the
loop's iterator). That line is the first statement that runs after the loop:

- the statement after it in the same block;
- when the loop is the last statement of an ``if``/``else`` branch, of a ``try`` body or
  of a ``try``'s ``else``: the try's ``else`` or ``finally`` that runs next, else the
  statement after the ``if``/``try`` (recursively);
- when the loop is the last statement of an enclosing loop's body: where that loop's
  ``break`` goes (the enclosing loop is left too, see ``Loop.through``); of a loop's
  ``else``: where that loop's ``break`` goes.

A loop with an ``else`` (its own, or an enclosing loop's it is left through) goes on at the
``else``'s first line instead: the skipped iterations are taken as run, so the loop ends as
its own end would, and a GPU running every iteration runs the ``else``.

**Loops that end a block.** A loop that is the last statement of a function, of the
module, of a ``with`` block, of an ``except`` handler, of a ``finally`` block or of a
``match`` case has no source line to jump to (CPython gives the implicit ``return None``
the loop header's line, and a jump out of a ``with`` would skip its ``__exit__``).
``pad_loops`` puts a ``pass`` after it in the same block, on a line number of its own
(``PAD_LINE`` and up), when the runner compiles the script; ``Loop.exit`` is that line.
In a file the runner did not compile (an ``--include``d module, imported as usual) the
jump is refused and the stop rule ends the script instead. A loop written on one line is
left out (its body has no line event of its own).

**Iterations left.** For ``for target in EXPR`` where ``EXPR`` is a name, an attribute,
a constant, integer arithmetic, or ``range``/``enumerate``/``zip``/``reversed``/
``len``/``min``/``max`` of such (the builtins, not a name the script rebinds), the
expression is evaluated again in the loop's frame and ``len()`` taken
(``remaining``); anything else (a generator, ``iter(...)``, ``tqdm(...)``, a method
call) is not evaluated, as it could have effects, and the count is unknown. So is one
that names a function's local variable before Python 3.13: reading it (``f_locals``)
would leave a copy of every local on the frame, holding a tensor the function drops
later (nanoGPT's ``logits`` of the last evaluation batch, 3 GiB at batch 32) and raising
the peak; global names (nanoGPT's ``eval_iters``) and a module's own are read directly.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import operator
import sys
import warnings
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from .statements import parse_source

__all__ = ["PAD_LINE", "Loop", "jump", "loop_table", "pad_loops", "remaining", "running_frame", "unsilence"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
#: statement -> (its parent, the parent's field holding it, its index there)
_Parents = dict[ast.AST, tuple[ast.AST, str, int]]
_TRY = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)


@dataclass(frozen=True)
class Loop:
    """One ``for``/``while`` loop: ``header`` and ``end`` lines (its ``else`` included),
    ``kind`` (``"for"`` or ``"while"``), ``exit``: the line a ``break`` of it goes on at,
    or its ``else``'s first line when it has one (None when no line can be jumped to; see
    the module docstring), ``through``: the
    headers of the enclosing loops (same function) that the jump to ``exit`` leaves too,
    innermost first, ``enclosing``: the headers of every loop of the same function
    around it, innermost first, and ``iterable``: a ``for`` loop's ``EXPR``."""

    header: int
    end: int
    kind: str
    exit: int | None
    through: tuple[int, ...] = ()
    enclosing: tuple[int, ...] = ()
    iterable: ast.expr | None = None


#: Pads (``pad_loops``) get line numbers from here on, beyond any source file's lines.
PAD_LINE = 1 << 24


def loop_table(filename: str) -> dict[int, Loop]:
    """``{header line: Loop}`` for every loop of ``filename`` (empty when it cannot be read
    or parsed)."""
    tree = parse_source(filename)
    if tree is None:
        return {}
    parents = _parents(tree)
    return {node.lineno: _loop(node, parents) for node in ast.walk(tree) if isinstance(node, _LOOPS)}


def pad_loops(tree: ast.Module) -> ast.Module:
    """``tree`` with a ``pass`` after each statement that ends a function or block with a
    loop in it (a loop no jump could leave otherwise; see the module docstring), on line
    ``PAD_LINE + that statement's first line``: a line of its own that no source line
    has, for the jump out of the loop to land on. The pad changes nothing the script
    does; its line events are not the script's (``steady`` drops them)."""
    parents = _parents(tree)
    ends: dict[ast.AST, ast.stmt] = {}
    for node in ast.walk(tree):
        if isinstance(node, _LOOPS):
            pad: list[ast.stmt] = []
            if not _one_line(node) and _after(node, parents, [], pad) is None and pad:
                ends[pad[0]] = pad[0]
    for end in sorted(ends, key=lambda n: -parents[n][2]):  # later first: the indices hold
        parent, field, index = parents[end]
        line = PAD_LINE + end.lineno  # type: ignore[attr-defined]
        col = end.col_offset  # type: ignore[attr-defined]
        getattr(parent, field).insert(
            index + 1, ast.Pass(lineno=line, col_offset=col, end_lineno=line, end_col_offset=col + 4)
        )
    return tree


def _parents(tree: ast.AST) -> _Parents:
    parents: _Parents = {}
    for node in ast.walk(tree):
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for index, child in enumerate(value):
                    if isinstance(child, ast.stmt):
                        parents[child] = (node, field, index)
    return parents


def _one_line(node: ast.stmt) -> bool:
    """A loop written on one line: its body has no line event of its own."""
    return bool(node.body) and node.body[0].lineno == node.lineno  # type: ignore[attr-defined]


def _loop(node: ast.stmt, parents: _Parents) -> Loop:
    through: list[int] = []
    pad: list[ast.stmt] = []
    if _one_line(node):
        exit_line = None
    elif node.orelse:  # type: ignore[attr-defined]
        exit_line = _first_line(node.orelse[0])  # type: ignore[attr-defined]
    else:
        exit_line = _after(node, parents, through, pad)
    if exit_line is None and pad and not _one_line(node):
        exit_line = PAD_LINE + pad[0].lineno  # type: ignore[attr-defined]
    enclosing = []
    parent = parents.get(node)
    while parent is not None and not isinstance(parent[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(parent[0], _LOOPS):
            enclosing.append(parent[0].lineno)
        parent = parents.get(parent[0])
    return Loop(
        header=node.lineno,
        end=node.end_lineno or node.lineno,
        kind="while" if isinstance(node, ast.While) else "for",
        exit=exit_line,
        through=tuple(through),
        enclosing=tuple(enclosing),
        iterable=None if isinstance(node, ast.While) else node.iter,  # type: ignore[attr-defined]
    )


def _after(node: ast.stmt, parents: _Parents, through: list[int], pad: list[ast.stmt]) -> int | None:
    """The first line that runs once ``node`` is done (see the module docstring); None
    when no source line does, with the statement that ends its block put in ``pad``."""
    if node not in parents:
        return None
    parent, field, index = parents[node]
    siblings = getattr(parent, field)
    if index + 1 < len(siblings):
        return _first_line(siblings[index + 1])
    if isinstance(parent, ast.If):
        return _after(parent, parents, through, pad)
    if isinstance(parent, _TRY) and field in ("body", "orelse"):
        follow = parent.orelse or parent.finalbody if field == "body" else parent.finalbody  # type: ignore[attr-defined]
        return _first_line(follow[0]) if follow else _after(parent, parents, through, pad)
    if isinstance(parent, _LOOPS):
        if field == "body":
            through.append(parent.lineno)
            if parent.orelse:  # the enclosing loop ends as its own end would: its else runs
                return _first_line(parent.orelse[0])
        return _after(parent, parents, through, pad)
    # the end of a function or module, a with block, an except handler, a finally block or
    # a match case: no jump out of it (or none to a line), but one to a pad within it
    pad.append(node)
    return None


def _first_line(node: ast.stmt) -> int:
    """The first line of a statement, its decorators included."""
    lines = [node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())]
    return min(lines)


# -- leaving a loop -----------------------------------------------------------------------------

_UNBOUND = "assigning None to .*unbound local"


def running_frame(code: CodeType) -> FrameType | None:
    """The innermost running frame of ``code``: the traced frame a line event came from,
    seen from inside the tracer's callback."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame


def jump(frame: FrameType, line: int) -> Any:
    """Move ``frame`` (at a line event) to ``line``; ``ValueError`` when Python refuses.
    Python 3.12+ binds None to the frame's locals still unbound and warns (under
    ``sys.settrace``, once the trace function returned): that one warning is silenced
    until ``unsilence`` is given the filter returned here (at the next line event)."""
    warnings.filterwarnings("ignore", message=_UNBOUND, category=RuntimeWarning)
    silenced = warnings.filters[0]
    try:
        frame.f_lineno = line
    except BaseException:
        unsilence(silenced)
        raise
    return silenced


def unsilence(silenced: Any) -> None:
    """Remove the warnings filter ``jump`` returned (None, as the watch keeps it)."""
    try:
        warnings.filters.remove(silenced)
        warnings._filters_mutated()  # type: ignore[attr-defined]
    except (ValueError, AttributeError):
        pass


# -- iterations left ----------------------------------------------------------------------------

_BUILTINS = {"range", "enumerate", "zip", "reversed", "len", "min", "max"}
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class _Unsafe(Exception):
    """The expression is not one we evaluate again."""


def remaining(loop: Loop, frame: FrameType, done: int) -> int | None:
    """Iterations the ``for`` loop ``loop`` had left when ``done`` of them had completed,
    with ``frame`` its frame; None when that cannot be known without effects."""
    if loop.iterable is None:
        return None
    try:
        value = _evaluate(loop.iterable, frame)
        total = _length(value)
    except Exception:  # noqa: BLE001 - any failure (unsafe, no len, a user error): unknown
        return None
    return max(total - done, 0)


def _length(value: Any) -> int:
    return value.length if isinstance(value, _Sized) else len(value)


class _Sized:
    """``enumerate``/``zip``/``reversed`` of sized things, by their length only."""

    def __init__(self, length: int) -> None:
        self.length = length


def _evaluate(node: ast.expr, frame: FrameType) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _lookup(node.id, frame)
    if isinstance(node, ast.Attribute):
        return getattr(_evaluate(node.value, frame), node.attr)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left, frame), _evaluate(node.right, frame)
        if not all(isinstance(v, int) for v in (left, right)):
            raise _Unsafe("arithmetic on something other than ints")
        if isinstance(node.op, ast.Pow) and not 0 <= right <= 64:
            raise _Unsafe("a large or negative power")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _evaluate(node.operand, frame)
        if not isinstance(value, int):
            raise _Unsafe("negation of something other than an int")
        return -value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        return _call(node.func.id, [_evaluate(arg, frame) for arg in node.args], frame)
    raise _Unsafe(type(node).__name__)


def _lookup(name: str, frame: FrameType) -> Any:
    code = frame.f_code
    if name in code.co_varnames or name in code.co_cellvars or name in code.co_freevars:
        if code.co_flags & inspect.CO_OPTIMIZED and sys.version_info < (3, 13):
            # frame.f_locals would be a copy of every local, kept on the frame: a tensor the
            # function drops later stays allocated (the peak rises by it)
            raise _Unsafe("a function's local variable before Python 3.13")
        locals_ = frame.f_locals
        if name not in locals_:
            raise _Unsafe(f"{name} is not bound")
        return locals_[name]
    if name in frame.f_globals:  # a module's or class body's frame: its namespace
        return frame.f_globals[name]
    return getattr(builtins, name)


def _call(name: str, args: list[Any], frame: FrameType) -> Any:
    if name not in _BUILTINS or _lookup(name, frame) is not getattr(builtins, name):
        raise _Unsafe(f"a call of {name}")
    if name == "range":
        if not all(isinstance(a, int) for a in args):
            raise _Unsafe("range of something other than ints")
        return range(*args)
    if name == "len" and len(args) == 1:
        return _length(args[0])
    if name in ("min", "max") and args and all(isinstance(a, int) for a in args):
        return min(args) if name == "min" else max(args)
    if name == "zip":
        return _Sized(min((_length(a) for a in args), default=0))
    if name in ("enumerate", "reversed") and 1 <= len(args) <= (2 if name == "enumerate" else 1):
        return _Sized(_length(args[0]))
    raise _Unsafe(f"{name} with these arguments")
