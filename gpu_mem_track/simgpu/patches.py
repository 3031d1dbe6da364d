"""Attributes set for a while and put back: each ``set`` remembers the old value (or its
absence) and ``restore`` undoes them all, newest first, even after a partial failure.

A plain function set in more than one place is set as a copy of itself in each after the
first, so that no two patched names hold the same object: TorchDynamo's table of torch
objects (``trace_rules.get_torch_obj_rule_map``), when built while the patches are on,
refuses one object under two names with different rules. ``restore`` also empties that
table's cache, so a table built with the stand-ins is not kept after them.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["Patches"]

_ABSENT = object()


class Patches:
    """A stack of attribute replacements (see the module doc)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._functions: set[int] = set()

    def set(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value``, remembering what was there (a plain function already
        set elsewhere is set as a copy of itself: see the module doc)."""
        old = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name, _ABSENT)
        if isinstance(value, types.FunctionType):
            if id(value) in self._functions:
                value = _copy(value)
            self._functions.add(id(value))
        self._saved.append((owner, name, old))
        setattr(owner, name, value)

    def restore(self) -> None:
        """Undo every ``set``, newest first."""
        while self._saved:
            owner, name, old = self._saved.pop()
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._functions.clear()
        rules = sys.modules.get("torch._dynamo.trace_rules")
        if rules is not None:
            rules.get_torch_obj_rule_map.cache_clear()


def _copy(function: types.FunctionType) -> types.FunctionType:
    """A new function object with ``function``'s code, globals, defaults and names."""
    copy = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    copy.__doc__ = function.__doc__
    copy.__dict__.update(function.__dict__)
    return copy
