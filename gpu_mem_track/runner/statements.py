"""Which statement each source line belongs to, so a statement spread over several lines
counts once per execution.

The tracing engines report a line event whenever execution moves to another line: the
call ``x = f(\\n    a,\\n    b)`` gives events for lines 1, 2, 3 and 1 again in one
execution. ``statement_starts`` maps every line of a multi-line statement (and of a
compound statement's header, such as an ``if`` condition over two lines) to the
statement's first line; the profiler treats events inside the statement it is already
running as part of that execution.
"""

from __future__ import annotations

import ast
import linecache

__all__ = ["parse_source", "statement_starts"]


def parse_source(filename: str) -> ast.Module | None:
    """The syntax tree of ``filename``'s source (through ``linecache``, so ``<stdin>`` and
    notebook cells work too); None when it cannot be read or parsed."""
    source = "".join(linecache.getlines(filename))
    if not source:
        return None
    try:
        return ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return None


def statement_starts(filename: str) -> dict[int, int]:
    """``{line: first line of its statement}`` for the lines of ``filename`` that are not
    the first line of their statement; empty when the source cannot be read or parsed."""
    tree = parse_source(filename)
    if tree is None:
        return {}
    starts: dict[int, int] = {}
    for node in ast.walk(tree):  # outer statements first: inner ones overwrite their lines
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            last = max(node.lineno, body[0].lineno - 1)  # a compound statement's header
        else:
            last = node.end_lineno or node.lineno
        for line in range(node.lineno + 1, last + 1):
            starts[line] = node.lineno
    return starts
