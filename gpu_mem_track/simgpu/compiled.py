"""torch.compile on the simulated GPU: which regions a script compiles, run as eager code.

What happens today, found by running a compiled ``nn.Module`` inside a simulated GPU with
``TORCH_LOGS=+dynamo`` (torch 2.13): ``torch.compile`` is not replaced; it returns its
``OptimizedModule`` (or wrapped function) as usual, and TorchDynamo's frame callback is
installed when the region runs. But the simulated GPU runs under dispatch modes (the
storage tracker and the known values, ``simgpu.session``), and Dynamo skips every frame
while one is active (``convert_frame``: "skipping: ... reason: non-infra torch dispatch
mode present, this is not supported today in torch.compile"). So no graph is captured,
AOTAutograd's partitioner and Inductor never run, and the region's Python runs eagerly on
the simulated tensors: its memory is eager PyTorch's. On a GPU, Inductor saves for
backward what ``min_cut_rematerialization_partition`` chooses (often fewer, recomputed
activations), reuses buffers by its own plan, and ``mode="reduce-overhead"`` adds CUDA
graphs' private pools; none of that is modelled, so a compiled script's peak may differ.

:class:`CompileWatch` says so: while the session runs it wraps ``torch.compile``,
``nn.Module.compile`` and ``torch._dynamo.optimize`` (``torch.compiler.compile`` goes
through ``torch.compile``) to record each call that compiles something, as a
:class:`~gpu_mem_track.simgpu.records.Compiled` per call site (the first frame outside
torch and this package), then calls the original: the script gets what it would have.
A call nested in another (``torch.compile`` calls ``torch._dynamo.optimize``,
``Module.compile`` calls ``torch.compile``) is the outer call's; ``disable=True`` and
``torch.compile(mode=...)`` used as a decorator factory are recorded when they compile
(the factory's own call compiles nothing). Not seen: a ``from torch._dynamo import
optimize`` bound before the session began, and Dynamo entered by other means
(``torch.export``, ``torch._dynamo.run``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .engine import user_line
from .patches import Patches
from .records import Compiled

__all__ = ["CompileWatch"]


class CompileWatch:
    """The compiled regions of one simulated GPU session (see the module doc)."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, int, str, str, str], int] = {}
        self._inside = threading.local()

    @property
    def regions(self) -> list[Compiled]:
        """Compiled regions per call site, in first-seen order."""
        return [
            Compiled(f, line, api, backend, mode, n)
            for (f, line, api, backend, mode), n in self._calls.items()
        ]

    def install(self, patches: Patches) -> None:
        """Wrap the three entry points until ``patches`` is restored."""
        import torch._dynamo

        compile_, module_compile, optimize = torch.compile, torch.nn.Module.compile, torch._dynamo.optimize
        patches.set(torch, "compile", self._wrap(compile_, "torch.compile", _compile_args))
        patches.set(torch.nn.Module, "compile", self._wrap(module_compile, "nn.Module.compile", _module_args))
        patches.set(torch._dynamo, "optimize", self._wrap(optimize, "torch._dynamo.optimize", _optimize_args))

    def _wrap(
        self, original: Callable[..., Any], api: str, read: Callable[..., tuple[str, str] | None]
    ) -> Any:
        inside = self._inside

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "depth", 0) == 0:
                what = read(*args, **kwargs)
                if what is not None:
                    self._note(api, *what)
            inside.depth = getattr(inside, "depth", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth -= 1

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__doc__ = original.__doc__
        wrapper.__name__ = getattr(original, "__name__", api)
        return wrapper

    def _note(self, api: str, backend: str, mode: str) -> None:
        filename, line = user_line()
        key = (filename, line, api, backend, mode)
        self._calls[key] = self._calls.get(key, 0) + 1


def _backend_name(backend: Any) -> str:
    if backend is None:
        return str(torch.compiler.get_default_backend())
    if isinstance(backend, str):
        return backend
    return str(getattr(backend, "__name__", type(backend).__name__))


def _mode(mode: Any, options: Any) -> str:
    if mode is not None:
        return str(mode)
    return "default" if options is None else "options"


def _compile_args(model: Any = None, *args: Any, **kwargs: Any) -> tuple[str, str] | None:
    """``torch.compile``'s (backend, mode), None when the call compiles nothing: no model
    (a decorator factory; its decorator calls ``torch.compile`` again) or ``disable``."""
    if model is None or kwargs.get("disable", False):
        return None
    return _backend_name(kwargs.get("backend")), _mode(kwargs.get("mode"), kwargs.get("options"))


def _module_args(self: Any, *args: Any, **kwargs: Any) -> tuple[str, str] | None:
    """``Module.compile``'s (backend, mode): it passes its arguments to ``torch.compile``."""
    if kwargs.get("disable", False):
        return None
    return _backend_name(kwargs.get("backend")), _mode(kwargs.get("mode"), kwargs.get("options"))


def _optimize_args(*args: Any, **kwargs: Any) -> tuple[str, str] | None:
    """``torch._dynamo.optimize``'s backend (positional or keyword, ``inductor`` by
    default); it has no mode."""
    if kwargs.get("disable", False):
        return None
    return _backend_name(args[0] if args else kwargs.get("backend", "inductor")), ""
