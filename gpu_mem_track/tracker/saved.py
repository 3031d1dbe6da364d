"""Tensors autograd saves for backward: which line and module saved them, while they live.

Most of a training step's memory between forward and backward is held by tensors the
autograd graph saves for backward (a linear layer's input, an activation function's
output). Without help they are C++-only objects: gc cannot see them, so on CUDA they are
"hidden" (allocated, but no visible tensor accounts for them).

``SavedTensorRecorder`` records them through ``torch.autograd.graph`` saved-tensor default
hooks. Its pack hook receives each tensor autograd saves and stores a *detached alias*
of it in the graph (same storage, no ``grad_fn``, so no reference cycle through the graph
and nothing copied); the recorder keeps only a weak reference to that alias, with a label
``saved at <file>:<line> (<module>)``: the first frame outside torch and gpu_mem_track,
and the innermost watched module running. When backward (without ``retain_graph``) or
``del`` frees the graph, the alias dies and its record goes with it.

While installed, the recorder also marks the tensors passed to a watched root module's
``forward`` as inputs (weak references, named ``input 0 of Net``, ``input mask of Net``).

The census (``take_census(..., saved=recorder)``) counts each storage once: a saved
tensor that is also a parameter stays a parameter, a saved input stays an input (see
``records.KINDS`` for the precedence).

Behaviour is kept: results and gradients are unchanged (double backward included), and
the in-place modification check autograd skips for hooked tensors is done by the unpack
hook instead, with autograd's message. Limits: saved-tensor hooks are per thread (record
in the thread that runs forward); tensors saved under the program's own saved-tensor
hooks (non-reentrant ``torch.utils.checkpoint``, CPU offloading) are not recorded; and
``torch.func`` transforms refuse to run while saved-tensor hooks are installed.
"""

from __future__ import annotations

import os
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .naming import Known

__all__ = ["SavedTensorRecorder", "user_site"]

_SKIPPED_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    # the whole package, not only tracker/: the simulated GPU's frames sit between the
    # user's line and the op (``run --simulate``)
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)
_INTERNAL_CODE: dict[types.CodeType, bool] = {}
_MAX_DEPTH = 200


def user_site(frame: types.FrameType | None) -> str:
    """``file:line`` of the first frame, from ``frame`` outwards, outside torch and
    gpu_mem_track (the file's base name); ``"?"`` when there is none."""
    depth = 0
    while frame is not None and depth < _MAX_DEPTH:
        code = frame.f_code
        internal = _INTERNAL_CODE.get(code)
        if internal is None:
            internal = _INTERNAL_CODE[code] = os.path.abspath(code.co_filename).startswith(_SKIPPED_DIRS)
        if not internal:
            return f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
        depth += 1
    return "?"


class SavedTensorRecorder:
    """Records the tensors autograd saves for backward, and a watched model's inputs.

    Use ``with recorder:`` around the forward pass, or ``install()`` ... ``uninstall()``
    around a whole program; calls nest. ``watch(model)`` names modules (before or while
    installed). ``known_tensors()`` hands the live records to the census. The recorder
    holds every tensor by weak reference only and keeps at most one small record per
    live saved tensor or input.
    """

    def __init__(self) -> None:
        self._saved: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        self._inputs: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        self._roots: list[tuple[str, weakref.ref[nn.Module]]] = []
        # By id, not by module: a module defining __eq__ may be unhashable.
        self._names: dict[int, tuple[weakref.ref[nn.Module], str]] = {}
        self._running: list[tuple[int, str]] = []
        self._depth = 0
        self._hooks: tuple[Any, Any] = (self._pack, self._unpack)
        self._handles: list[Any] = []

    # -- registration ---------------------------------------------------------------------------

    def watch(self, module: nn.Module, prefix: str = "") -> None:
        """Name ``module``'s submodules (``encoder.layers.0.linear1``, under ``prefix``) in
        labels, and mark the tensors passed to its ``forward`` as inputs while installed.
        Held by weak reference."""
        if any(p == prefix and r() is module for p, r in self._roots):
            return
        self._roots.append((prefix, weakref.ref(module)))
        self._name_modules(module, prefix)
        if self._depth:
            self._handles.append(module.register_forward_pre_hook(self._mark_inputs, with_kwargs=True))

    def name(self, module: nn.Module, prefix: str = "") -> None:
        """Name ``module``'s submodules in labels, as ``watch`` does, but without marking
        its inputs (for models the census found by itself). Does nothing for a module
        already named."""
        if self._name_of(module) is None:
            self._name_modules(module, prefix)

    def _name_modules(self, module: nn.Module, prefix: str) -> None:
        self._names = {key: entry for key, entry in self._names.items() if entry[0]() is not None}
        for name, sub in module.named_modules(prefix=prefix):
            if self._name_of(sub) is None:
                self._names[id(sub)] = (weakref.ref(sub), name or type(module).__name__)

    def _name_of(self, module: nn.Module) -> str | None:
        entry = self._names.get(id(module))
        return entry[1] if entry is not None and entry[0]() is module else None

    # -- installation ---------------------------------------------------------------------------

    @property
    def installed(self) -> bool:
        """Whether the hooks are installed (by this thread's ``install``)."""
        return self._depth > 0

    def install(self) -> SavedTensorRecorder:
        """Push the saved-tensor hooks (this thread) and, on the first call, add the module
        hooks. Returns the recorder. Each call needs one ``uninstall``."""
        torch._C._autograd._push_saved_tensors_default_hooks(*self._hooks)
        self._depth += 1
        if self._depth == 1:
            self._add_module_hooks()
        return self

    def uninstall(self) -> None:
        """Undo one ``install``. Raises ``RuntimeError`` when other saved-tensor hooks were
        pushed after ours and are still installed (they must be removed first)."""
        if self._depth == 0:
            raise RuntimeError("the saved-tensor recorder is not installed")
        top = _top_hooks()
        if top is not None and tuple(top) != self._hooks:
            raise RuntimeError(
                "other saved-tensor hooks were installed after the recorder's; remove them first"
            )
        torch._C._autograd._pop_saved_tensors_default_hooks()
        self._depth -= 1
        if self._depth == 0:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self._running.clear()

    def __enter__(self) -> SavedTensorRecorder:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()

    def _add_module_hooks(self) -> None:
        hooks = nn.modules.module
        self._handles.append(hooks.register_module_forward_pre_hook(self._enter_module))
        self._handles.append(hooks.register_module_forward_hook(self._leave_module, always_call=True))
        for prefix, ref in list(self._roots):
            module = ref()
            if module is not None:
                self._name_modules(module, prefix)  # submodules added since watch()
                self._handles.append(module.register_forward_pre_hook(self._mark_inputs, with_kwargs=True))

    # -- hooks ----------------------------------------------------------------------------------

    def _enter_module(self, module: nn.Module, args: Any) -> None:
        name = self._name_of(module)
        if name is not None:
            self._running.append((id(module), name))

    def _leave_module(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._running and self._running[-1][0] == id(module):
            self._running.pop()

    def _mark_inputs(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        owner = self._name_of(module) or type(module).__name__
        for key, tensor in _tensors_in(args, kwargs):
            ref = weakref.ref(tensor, self._forget_input)
            self._inputs[id(ref)] = (ref, f"input {key} of {owner}")

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int | None]:
        try:
            alias = tensor.detach()
            version = tensor._version
        except Exception:  # a tensor that cannot be aliased: saved as autograd would
            return tensor, None
        label = f"saved at {user_site(sys._getframe(1))}"
        if self._running:
            label += f" ({self._running[-1][1]})"
        ref = weakref.ref(alias, self._forget_saved)
        self._saved[id(ref)] = (ref, label)
        return alias, version

    @staticmethod
    def _unpack(packed: tuple[torch.Tensor, int | None]) -> torch.Tensor:
        alias, version = packed
        # Autograd skips its in-place check for hooked tensors; the alias shares the
        # saved tensor's version counter, so the check can be made here.
        if version is not None and alias._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace"
                f" operation: [{alias.type()} {list(alias.shape)}] is at version {alias._version};"
                f" expected version {version} instead. (Checked by gpu_mem_track's saved-tensor"
                " recorder, which stands in for autograd's own check while it records.)"
            )
        return alias

    def _forget_saved(self, ref: weakref.ref[torch.Tensor]) -> None:
        self._saved.pop(id(ref), None)

    def _forget_input(self, ref: weakref.ref[torch.Tensor]) -> None:
        self._inputs.pop(id(ref), None)

    # -- results --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of live saved tensors recorded (aliases, not distinct storages)."""
        return len(self._saved)

    def known_tensors(self) -> list[Known]:
        """Live inputs (kind ``"Input"``) and saved tensors (kind ``"Activation"``, named
        ``saved at file:line (module)``), for one census; drop the list promptly."""
        known = [Known(t, "Input", name) for t, name in _alive(self._inputs)]
        known.extend(Known(t, "Activation", name) for t, name in _alive(self._saved))
        return known


def _alive(records: dict[int, tuple[weakref.ref[torch.Tensor], str]]) -> Iterator[tuple[torch.Tensor, str]]:
    for ref, name in list(records.values()):
        tensor = ref()
        if tensor is not None:
            yield tensor, name


def _tensors_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors among forward's arguments, and inside tuples, lists and dicts one level down."""
    items = [(str(i), value) for i, value in enumerate(args)] + list(kwargs.items())
    for key, value in items:
        if isinstance(value, torch.Tensor):
            yield key, value
        elif isinstance(value, (tuple, list)):
            yield from ((f"{key}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor))
        elif isinstance(value, dict):
            yield from ((f"{key}[{k!r}]", v) for k, v in value.items() if isinstance(v, torch.Tensor))


def _top_hooks() -> Any:
    """This thread's innermost saved-tensor default hooks, or None (torch 2.1+ spellings)."""
    top = torch._C._autograd._top_saved_tensors_default_hooks
    try:
        return top(True)
    except TypeError:
        return top()
