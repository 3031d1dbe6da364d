"""Module calls seen from outside: the hook the model levers (autocast, checkpoint) share.

While installed, ``torch.nn.Module.__call__`` is replaced by a function that counts how
deep in module calls it is (per thread). A call at depth 0 (no module's forward is
running: the script calling its model, or a loss module) goes through the *outer* hooks,
which may enter context managers around it (autocast); a call inside a forward goes
through the *inner* hooks, which may run it another way (through checkpoint). Modules
that define their own ``__call__`` and forwards called directly (``model.forward(x)``)
are not seen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

__all__ = ["ModuleCalls"]

#: An outer hook: (module, the ExitStack around its call) -> None.
OuterHook = Callable[[Any, ExitStack], None]
#: Runs a module's call: (args, kwargs) -> its result.
Runner = Callable[..., Any]
#: An inner hook: module -> None (call it as usual) or a function (run, args, kwargs) -> result.
InnerHook = Callable[[Any], "Callable[[Runner, tuple, dict], Any] | None"]


class ModuleCalls:
    """The replaced ``Module.__call__`` (see the module doc); ``outer`` and ``inner`` are
    the hooks, in the order the levers were given."""

    def __init__(self) -> None:
        self.outer: list[OuterHook] = []
        self.inner: list[InnerHook] = []
        self._local = threading.local()
        self._original: Any = None

    def install(self) -> None:
        import torch

        self._original = torch.nn.Module.__call__
        calls = self

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            return calls._call(module, args, kwargs)

        torch.nn.Module.__call__ = __call__  # type: ignore[method-assign]

    def uninstall(self) -> None:
        import torch

        if self._original is not None:
            torch.nn.Module.__call__ = self._original  # type: ignore[method-assign]
            self._original = None

    def _call(self, module: Any, args: tuple, kwargs: dict) -> Any:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            with ExitStack() as stack:
                for hook in self.outer:
                    hook(module, stack)
                return self._run(module, 1, args, kwargs)
        for hook in self.inner:
            other = hook(module)
            if other is not None:

                def run(*a: Any, **k: Any) -> Any:
                    return self._run(module, depth + 1, a, k)

                return other(run, args, kwargs)
        return self._run(module, depth + 1, args, kwargs)

    def _run(self, module: Any, depth: int, args: tuple, kwargs: dict) -> Any:
        """The module's own call, with the depth its forward runs at."""
        before = getattr(self._local, "depth", 0)
        self._local.depth = depth
        try:
            return self._original(module, *args, **kwargs)
        finally:
            self._local.depth = before
