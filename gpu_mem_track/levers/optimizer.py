"""The optimizer levers: ``fused``, ``no-foreach`` and ``grads-to-none``.

``fused`` and ``no-foreach`` rewrite the arguments of optimizers built while the run
goes on: the ``__init__`` of every ``torch.optim`` class is patched
(``OptimizerBuilds``; a class whose ``__init__`` lacks the keyword is left as it is, and
the report says so), so ``torch.optim.AdamW(params, lr=...)`` is built as
``torch.optim.AdamW(params, lr=..., fused=True)`` would be; a subclass that calls its
base's ``__init__`` is rewritten there, once (the outermost patched ``__init__``).
Optimizers built before the run started, and classes outside ``torch.optim`` that do not
call one of its ``__init__``, are not changed. A parameter iterator (such as
``model.parameters()``) is read into a list first, so its devices can be checked (as the
optimizer itself would read it).

``fused`` is set where the class takes it and every parameter is a floating-point CUDA
tensor (the simulated GPU's included); not where the script set ``fused=True`` already,
``foreach=True`` or ``differentiable=True``. ``no-foreach`` sets ``foreach=False``
unless the script set it or the optimizer is fused. ``grads-to-none`` makes
``Optimizer.zero_grad`` and ``Module.zero_grad`` set gradients to None when the script
asked ``set_to_none=False`` (torch's default is True since 2.0, so only such calls
change).
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from .catalog import describe
from .records import LeverReport
from .source import Site, call_with_keyword, caller

__all__ = ["FusedLever", "GradsToNoneLever", "NoForeachLever", "OptimizerBuilds"]

#: A rewrite: (the optimizer's class, bound arguments, whether the class takes its keyword,
#: the user's line that built the optimizer, the name called there) -> None; it changes
#: the arguments in place.
Rewrite = Callable[[type, dict[str, Any], bool, "Site | None", str], None]


class OptimizerBuilds:
    """The patched ``__init__`` of ``torch.optim``'s classes; ``rewrites`` run in order
    on each optimizer's arguments (see the module doc)."""

    def __init__(self) -> None:
        self.rewrites: list[tuple[str, Rewrite]] = []  # (keyword, rewrite)
        self._local = threading.local()
        self._saved: list[tuple[type, Any]] = []

    def install(self) -> None:
        import torch

        for value in vars(torch.optim).values():
            init = vars(value).get("__init__") if isinstance(value, type) else None
            if init is not None and issubclass(value, torch.optim.Optimizer):
                self._saved.append((value, init))  # every class: those without the keyword are told
                value.__init__ = self._patched(value, init)  # type: ignore[misc]

    def uninstall(self) -> None:
        for cls, init in reversed(self._saved):
            cls.__init__ = init  # type: ignore[misc]
        self._saved.clear()

    def _patched(self, owner: type, init: Any) -> Any:
        signature = inspect.signature(init)
        taken = set(signature.parameters)
        builds = self

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(builds._local, "inside", False):
                return init(optimizer, *args, **kwargs)
            builds._local.inside = True
            try:
                try:
                    bound = signature.bind(optimizer, *args, **kwargs)
                except TypeError:  # the script's own mistake: torch's own message tells it
                    return init(optimizer, *args, **kwargs)
                _read_iterators(bound.arguments)
                site = caller(sys._getframe(1))
                kind = type(optimizer)
                # a subclass with an __init__ of its own: the change goes in its super().__init__(...)
                own = next(c for c in kind.__mro__ if "__init__" in vars(c)) is not owner
                for keyword, rewrite in builds.rewrites:
                    rewrite(
                        kind, bound.arguments, keyword in taken, site, "__init__" if own else kind.__name__
                    )
                return init(*bound.args, **bound.kwargs)
            finally:
                builds._local.inside = False

        __init__.__wrapped__ = init  # type: ignore[attr-defined]
        return __init__


def _read_iterators(arguments: dict[str, Any]) -> None:
    """``params`` (and each group's ``params``) as a list where it was an iterator."""
    params = arguments.get("params")
    if isinstance(params, Iterator):
        params = arguments["params"] = list(params)
    if isinstance(params, list):
        for i, group in enumerate(params):
            if isinstance(group, dict) and isinstance(group.get("params"), Iterator):
                params[i] = {**group, "params": list(group["params"])}


def _tensors(arguments: dict[str, Any]) -> list[Any]:
    import torch

    found: list[Any] = []
    params = arguments.get("params")
    items = [params] if isinstance(params, torch.Tensor) else list(params or ())
    for item in items:
        if isinstance(item, dict):
            inner = item.get("params")
            found += [inner] if isinstance(inner, torch.Tensor) else list(inner or ())
        else:
            found.append(item)
    return [t[1] if isinstance(t, tuple) else t for t in found]  # named parameters: (name, tensor)


class _OptimizerLever:
    """A lever that sets one keyword of the optimizers built (``fused``, ``foreach``)."""

    name = ""
    keyword = ""
    value: bool = False

    def __init__(self, builds: OptimizerBuilds) -> None:
        builds.rewrites.append((self.keyword, self._rewrite))
        self.changed: Counter[str] = Counter()
        self.kept: Counter[str] = Counter()  # why an optimizer was left as it was
        self.site: Site | None = None
        self.callee = ""
        self.generic = ""

    def _rewrite(
        self, kind: type, arguments: dict[str, Any], takes: bool, site: Site | None, callee: str
    ) -> None:
        cls = kind.__name__
        why = self._why_not(cls, arguments) if takes else f"{cls} does not take {self.keyword}"
        if why:
            self.kept[why] += 1
            return
        arguments[self.keyword] = self.value
        self.changed[cls] += 1
        if self.site is None:
            self.site, self.callee = site, callee
            prefix = "torch.optim." if kind.__module__.startswith("torch.optim") else ""
            self.generic = "super().__init__(params, " if callee == "__init__" else f"{prefix}{cls}(params, "

    def _why_not(self, cls: str, arguments: dict[str, Any]) -> str:
        raise NotImplementedError

    def report(self) -> LeverReport:
        info = describe(self.name)
        if not self.changed:
            why = "; ".join(self.kept) or "the script built no torch.optim optimizer while it ran"
            return LeverReport(self.name, False, why, cost=info.cost, reached=bool(self.kept))
        total = sum(self.changed.values())
        names = ", ".join(cls if n == 1 else f"{n} x {cls}" for cls, n in self.changed.items())
        detail = f"{total} optimizer{'s' if total > 1 else ''}: {names}"
        if self.kept:
            detail += f" (left as they were: {'; '.join(self.kept)})"
        generic = f"{self.generic}{self.keyword}={self.value})"
        site, change = self.site, generic
        if site is not None:
            change = call_with_keyword(site.text, self.callee, self.keyword, self.value, generic)
        return LeverReport(self.name, True, "", detail, change, site.where if site else "", info.cost)


class FusedLever(_OptimizerLever):
    name, keyword, value = "fused", "fused", True

    def _why_not(self, cls: str, arguments: dict[str, Any]) -> str:
        if arguments.get("fused"):
            return f"{cls} is already fused (fused=True)"
        if arguments.get("foreach"):
            return f"{cls} sets foreach=True, which fused=True cannot join"
        if arguments.get("differentiable"):
            return f"{cls} sets differentiable=True, which fused=True does not support"
        tensors = _tensors(arguments)
        if not tensors or not all(t.is_cuda and t.is_floating_point() for t in tensors):
            return f"{cls}'s parameters are not all floating-point CUDA tensors"
        return ""


class NoForeachLever(_OptimizerLever):
    name, keyword, value = "no-foreach", "foreach", False

    def _why_not(self, cls: str, arguments: dict[str, Any]) -> str:
        if arguments.get("fused"):
            return f"{cls} is fused (fused=True): foreach does not apply"
        if arguments.get("foreach") is False:
            return f"{cls} already sets foreach=False"
        if arguments.get("foreach") is None and not all(t.is_cuda for t in _tensors(arguments)):
            return f"{cls}'s parameters are not all on CUDA: torch's default there is foreach=False already"
        return ""


class GradsToNoneLever:
    """``zero_grad(set_to_none=False)`` calls made to set gradients to None instead."""

    name = "grads-to-none"

    def __init__(self) -> None:
        self.changed = 0
        self.kept = 0
        self.site: Site | None = None
        self._saved: list[tuple[type, Any]] = []

    def install(self) -> None:
        import torch

        for cls in (torch.optim.Optimizer, torch.nn.Module):
            original = vars(cls)["zero_grad"]
            self._saved.append((cls, original))
            cls.zero_grad = self._patched(original)  # type: ignore[method-assign]

    def uninstall(self) -> None:
        for cls, original in reversed(self._saved):
            cls.zero_grad = original  # type: ignore[method-assign]
        self._saved.clear()

    def _patched(self, original: Any) -> Any:
        signature = inspect.signature(original)
        lever = self

        def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(owner, *args, **kwargs)
            except TypeError:  # the script's own mistake: torch's own message tells it
                return original(owner, *args, **kwargs)
            if bound.arguments.get("set_to_none", True):
                lever.kept += 1
                return original(owner, *args, **kwargs)
            bound.arguments["set_to_none"] = True
            lever.changed += 1
            if lever.site is None:
                lever.site = caller(sys._getframe(1))
            return original(*bound.args, **bound.kwargs)

        zero_grad.__wrapped__ = original  # type: ignore[attr-defined]
        return zero_grad

    def report(self) -> LeverReport:
        info = describe(self.name)
        if not self.changed:
            why = (
                f"every zero_grad() call ({self.kept}) already sets gradients to None "
                "(torch's default since 2.0)"
                if self.kept
                else "the script called no zero_grad()"
            )
            return LeverReport(self.name, False, why, cost=info.cost, reached=bool(self.kept))
        detail = f"{self.changed} zero_grad(set_to_none=False) call(s) set gradients to None"
        if self.kept:
            detail += f" ({self.kept} other call(s) already did)"
        site, change = self.site, info.change
        if site is not None:
            change = call_with_keyword(site.text, "zero_grad", "set_to_none", True, change)
        return LeverReport(self.name, True, "", detail, change, site.where if site else "", info.cost)
