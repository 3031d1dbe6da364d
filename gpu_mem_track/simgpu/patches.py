"""Attributes set for a while and put back: each ``set`` remembers the old value (or its
absence) and ``restore`` undoes them all, newest first, even after a partial failure."""

from __future__ import annotations

from typing import Any

__all__ = ["Patches"]

_ABSENT = object()


class Patches:
    """A stack of attribute replacements (see the module doc)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value``, remembering what was there."""
        old = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name, _ABSENT)
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
