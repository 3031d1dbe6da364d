"""Who owns which tensor: watched objects, objects found in the caller's frames, and names.

A *root* is an ``nn.Module``, a ``torch.optim.Optimizer`` or a tensor, with the name it
is known by. Roots come from ``MemTracker.watch`` (held through weak references, so
watching keeps nothing alive), from the frames of the code that calls ``track()``, and
from the census's finder (``finder.Owners``: every live model and optimizer, wherever
the program keeps it). A name prefix is the name the program gave: a module bound at
module level as ``cnn`` names its parameters ``cnn.21.weight``, as ``watch(cnn=cnn)``
would; ``watch(model)`` and models found only by the finder have no prefix
(``features.0.weight``). Of the roots for one object, the first source wins
(``merge_roots``): watched, then bound to a name, then found.

Frames are read without side effects: module-level namespaces always, function locals
only on Python 3.13+, where ``frame.f_locals`` is a live view. On older Pythons reading
a function's ``f_locals`` stores references to its locals in the frame, which would keep
a tensor the function later deletes alive until the next read.
"""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Known", "Registry", "frame_roots", "known_tensors", "merge_roots"]

_LIVE_LOCALS = sys.version_info >= (3, 13)
_MAX_FRAMES = 64


@dataclass
class Known:
    """A tensor with the kind and name a root gives it (held only during one census)."""

    tensor: torch.Tensor
    kind: str | None
    name: str | None


class Registry:
    """Objects the user registered with ``watch``, held by weak reference."""

    def __init__(self) -> None:
        self._refs: list[tuple[str, weakref.ref[Any]]] = []

    def add(self, obj: Any, prefix: str = "") -> None:
        """Register a module, optimizer or tensor under an optional name prefix.

        Raises ``TypeError`` for anything else.
        """
        cls = type(obj)  # not isinstance: a weakref.proxy would pass it, then fail below
        if not issubclass(cls, (nn.Module, torch.optim.Optimizer, torch.Tensor)):
            raise TypeError(
                f"watch() takes nn.Module, torch.optim.Optimizer or tensor objects, not {cls.__name__}"
            )
        if any(p == prefix and r() is obj for p, r in self._refs):
            return
        self._refs.append((prefix, weakref.ref(obj)))

    def roots(self) -> list[tuple[str, Any]]:
        """The registered objects still alive, with their prefixes."""
        alive = [(prefix, ref()) for prefix, ref in self._refs]
        self._refs = [(p, r) for p, r in self._refs if r() is not None]
        return [(prefix, obj) for prefix, obj in alive if obj is not None]


def frame_roots(frame: types.FrameType | None) -> list[tuple[str, Any]]:
    """Modules, optimizers and tensors bound to names in ``frame`` and its callers, with
    the variable name (a module's parameters are then ``<name>.<path in the tree>``).

    A module or optimizer bound to several names keeps the first found (innermost frame
    first, locals before globals).
    """
    roots: list[tuple[str, Any]] = []
    seen: set[int] = set()
    depth = 0
    while frame is not None and depth < _MAX_FRAMES:
        namespaces = [frame.f_globals]
        if _LIVE_LOCALS and frame.f_locals is not frame.f_globals:
            namespaces.insert(0, frame.f_locals)
        for namespace in namespaces:
            roots.extend(_namespace_roots(namespace, seen))
        frame = frame.f_back
        depth += 1
    return roots


def _namespace_roots(namespace: Any, seen: set[int]) -> Iterator[tuple[str, Any]]:
    if id(namespace) in seen:
        return
    seen.add(id(namespace))
    try:
        items = list(namespace.items())
    except Exception:
        return
    for name, value in items:
        # issubclass(type(v)) rather than isinstance: isinstance on a dead weakref.proxy raises.
        cls = type(value)
        if issubclass(cls, torch.Tensor):
            yield str(name), value
        elif issubclass(cls, (nn.Module, torch.optim.Optimizer)) and id(value) not in seen:
            seen.add(id(value))
            yield str(name), value


def merge_roots(*sources: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The roots of all ``sources`` in order, except modules and optimizers an earlier
    source already gave (watched before bound to a name before found)."""
    merged = list(sources[0]) if sources else []
    given = {id(obj) for _, obj in merged}
    for source in sources[1:]:
        for prefix, obj in source:
            if issubclass(type(obj), torch.Tensor):
                merged.append((prefix, obj))
            elif id(obj) not in given:
                given.add(id(obj))
                merged.append((prefix, obj))
    return merged


def known_tensors(roots: list[tuple[str, Any]]) -> Iterator[Known]:
    """Every tensor the roots name: parameters, buffers, optimizer state, named tensors.

    Modules are visited largest first so a parameter reachable from a model and from one
    of its submodules takes the model's (longer) name. Earlier roots win ties.
    """
    # Each module's tensors listed once; sized by their parameters, not by another walk.
    modules = [list(_module_tensors(o, p)) for p, o in roots if isinstance(o, nn.Module)]
    if len(modules) > 1:
        modules.sort(key=lambda tensors: -sum(1 for k in tensors if k.kind == "Parameter"))
    param_names: dict[int, str] = {}
    for tensors in modules:
        for known in tensors:
            if known.kind == "Parameter":
                param_names.setdefault(id(known.tensor), known.name or "")
            yield known
    del modules
    for prefix, obj in roots:
        if isinstance(obj, torch.optim.Optimizer):
            yield from _optimizer_tensors(obj, prefix, param_names)
        elif isinstance(obj, torch.Tensor):
            yield Known(obj, None, prefix or None)


def _module_tensors(module: nn.Module, prefix: str) -> Iterator[Known]:
    try:
        params = list(module.named_parameters(prefix=prefix))
        buffers = list(module.named_buffers(prefix=prefix))
    except Exception:
        return
    for name, param in params:
        yield Known(param, "Parameter", name)
    for name, buffer in buffers:
        if isinstance(buffer, torch.Tensor):
            yield Known(buffer, "Buffer", name)


def _optimizer_tensors(
    optimizer: torch.optim.Optimizer, prefix: str, param_names: dict[int, str]
) -> Iterator[Known]:
    try:
        groups = [list(group["params"]) for group in optimizer.param_groups]
        state = optimizer.state
    except Exception:
        return
    for g, params in enumerate(groups):
        for i, param in enumerate(params):
            owner = param_names.get(id(param)) or f"{prefix or 'optimizer'}.param_groups[{g}][{i}]"
            entries = state.get(param) if hasattr(state, "get") else None
            for key, value in (entries or {}).items():
                if isinstance(value, torch.Tensor):
                    yield Known(value, "Optimizer state", f"{key} of {owner}")
