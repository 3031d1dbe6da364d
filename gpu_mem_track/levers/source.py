"""Where in the user's code a lever acted, and the line to write there instead.

``caller`` finds the innermost frame of the user's code (not torch, not the standard
library, not this package); ``call_with_keyword``, ``wrapped_call``, ``looped_call`` and
``prefixed`` turn that frame's source line into the edited line a user would write. Each falls back
to the lever's generic change when the line is not one simple statement (a call spread
over several lines, a line that cannot be read).
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
import sysconfig
from types import FrameType

__all__ = [
    "Site",
    "call_with_keyword",
    "called_from_user",
    "callee",
    "caller",
    "looped_call",
    "prefixed",
    "wrapped_call",
]

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])


class Site:
    """A place in the user's code: ``file``, ``line`` and the stripped source ``text``
    ("" when it cannot be read)."""

    __slots__ = ("file", "line", "text")

    def __init__(self, file: str, line: int) -> None:
        self.file, self.line = file, line
        self.text = linecache.getline(file, line).strip()

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@functools.lru_cache(maxsize=1024)
def _library(filename: str) -> bool:
    """Whether ``filename`` is this package's, torch's or the standard library's."""
    if filename.startswith("<"):
        return True
    real = os.path.realpath(filename)
    if real.startswith(_OURS + os.sep) or _is_torch(real):
        return True
    return real.startswith(_STDLIB + os.sep) and not _in_site_packages(real)


def _in_site_packages(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def _is_torch(path: str) -> bool:
    torch = sys.modules.get("torch")
    root = os.path.dirname(os.path.realpath(getattr(torch, "__file__", "") or "")) if torch else ""
    return bool(root) and path.startswith(root + os.sep)


def caller(frame: FrameType | None) -> Site | None:
    """The innermost frame from ``frame`` outwards that runs the user's code, as a
    ``Site`` (None when every frame is a library's)."""
    while frame is not None:
        if not _library(frame.f_code.co_filename):
            return Site(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


def called_from_user(frame: FrameType | None) -> bool:
    """Whether the first frame from ``frame`` outwards that is not this package's runs
    the user's code (False: torch's, as ``Sequential.forward`` calling its children)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not os.path.realpath(name).startswith(_OURS + os.sep):
            return not _library(name)
        frame = frame.f_back
    return False


def _parsed(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _calls_named(tree: ast.AST, callee: str) -> list[ast.Call]:
    """The calls in ``tree`` of a function or method named ``callee`` (its last name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == callee:
                found.append(node)
    return found


def call_with_keyword(text: str, callee: str, keyword: str, value: object, fallback: str) -> str:
    """``text`` (one line of code) with ``keyword=value`` set in its one call of
    ``callee`` (e.g. ``AdamW`` in ``opt = torch.optim.AdamW(p, lr=1e-3)``), the rest of
    the line as written; ``fallback`` when the line has no single such call."""
    tree = _parsed(text)
    calls = _calls_named(tree, callee) if tree is not None else []
    if len(calls) != 1:
        return fallback
    call, literal = calls[0], repr(value)
    old = next((k for k in call.keywords if k.arg == keyword), None)
    if old is not None:
        return _splice(text, old.value, literal)
    raw = text.encode()
    end = (call.end_col_offset or 1) - 1  # the closing parenthesis (offsets count UTF-8 bytes)
    inside = raw[:end].decode().rstrip()
    comma = "" if inside.endswith(("(", ",")) else ", "
    return f"{inside}{comma}{keyword}={literal}{raw[end:].decode()}"


def callee(text: str) -> str | None:
    """What ``text`` (one line of code) calls when it holds one call only, of a name or
    an attribute of names (``model`` in ``loss = model(x).loss``, ``self.net`` in
    ``out = self.net(x)``); None otherwise."""
    tree = _parsed(text)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)] if tree is not None else []
    if len(calls) != 1:
        return None
    func = calls[0].func
    node = func
    while isinstance(node, ast.Attribute):
        node = node.value
    return ast.get_source_segment(text, func) if isinstance(node, ast.Name) else None


def _splice(text: str, node: ast.expr, replacement: str) -> str:
    """``text`` with ``node``'s source replaced (ast offsets count UTF-8 bytes)."""
    raw = text.encode()
    return raw[: node.col_offset].decode() + replacement + raw[node.end_col_offset :].decode()


def wrapped_call(text: str, function: str, extra: str, fallback: str) -> str:
    """``text`` (one line holding one statement whose value is a call ``f(a, b)``) with
    that call as ``function(f, a, b, extra)``, e.g. a block's call through checkpoint;
    ``fallback`` otherwise."""
    tree = _parsed(text)
    if tree is None or len(tree.body) != 1 or not isinstance(getattr(tree.body[0], "value", None), ast.Call):
        return fallback
    call = tree.body[0].value
    assert isinstance(call, ast.Call)
    parts = [ast.get_source_segment(text, call.func) or ""]
    parts += [ast.get_source_segment(text, arg) or "" for arg in call.args]
    for k in call.keywords:
        value = ast.get_source_segment(text, k.value) or ""
        parts.append(f"**{value}" if k.arg is None else f"{k.arg}={value}")
    return _splice(text, call, f"{function}({', '.join([*parts, extra])})")


def looped_call(text: str, function: str, extra: str, fallback: str) -> str:
    """``text`` (``x = blocks(x)``: a container called on the name it assigns) as
    ``for block in blocks: x = function(block, x, extra)``; ``fallback`` otherwise."""
    tree = _parsed(text)
    node = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.value, ast.Call):
        return fallback
    call = node.value
    if len(call.args) != 1 or call.keywords:
        return fallback
    target, arg = ast.get_source_segment(text, node.targets[0]), ast.get_source_segment(text, call.args[0])
    if target != arg:
        return fallback
    blocks = ast.get_source_segment(text, call.func)
    return f"for block in {blocks}: {arg} = {function}(block, {arg}, {extra})"


def prefixed(text: str, prefix: str, fallback: str) -> str:
    """``prefix`` + ``text`` when ``text`` is one simple statement (so ``with ...:
    text`` is one valid line); ``fallback`` otherwise."""
    tree = _parsed(text)
    if tree is None or len(tree.body) != 1:
        return fallback
    if isinstance(tree.body[0], ast.For | ast.While | ast.If | ast.With | ast.Try | ast.FunctionDef):
        return fallback
    return f"{prefix} {text}"
