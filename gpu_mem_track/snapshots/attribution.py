"""Which source line and which phase a recorded stack belongs to.

A snapshot's stacks come from the machine that recorded it, so user code is told by the
paths' shape, not by importing anything: a frame is *user code* when its file ends in
``.py`` and lies outside torch, the standard library (``.../lib/pythonX.Y/``), installed
packages (``site-packages``, ``dist-packages``) and this package, or when ``--include``
names it. C++ frames (``??``, ``*.cpp``, empty file names) are never user code.

An allocation belongs to the innermost user frame of its stack (``Site``). A stack with
none (the autograd engine's thread runs backward with C++ frames only) goes to the
autograd node that ran (``<backward>``, e.g. ``MmBackward0``), else to the innermost
Python frame of any library, else to ``<no Python frame>``.

Phases (``CATEGORIES``), the first that applies: ``optimizer`` (a frame in
``torch/optim``), ``backward`` (a frame of autograd's engine, or a call into backward:
``backward`` in ``torch/autograd`` or ``torch/_tensor.py``, ``grad`` in ``torch/autograd``),
``forward`` (under ``Module._call_impl`` in
``torch/nn/modules/module.py``), else ``other``. That is one stack's phase: read in
the trace's order, stacks without Python frames made while backward runs belong to it
(``phases``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..snapshotfile.records import Frame

__all__ = ["CATEGORIES", "PRE_TRACE", "Attributor", "Site", "is_backward_call"]

#: Phases an allocation can be placed in from its stack, plus memory live before the trace.
CATEGORIES = ("forward", "backward", "optimizer", "other", "before recording")

_LIBRARY = re.compile(r"/(?:site-packages|dist-packages)/|/lib/python\d+(?:\.\d+)?/|/torch/|/gpu_mem_track/")
_NODE = re.compile(r"(?:^|::)(\w+)::apply\(")


@dataclass(frozen=True)
class Site:
    """Where bytes are attributed: a source ``file``, ``function`` and ``line`` (0 for the
    pseudo-sites whose file is written in angle brackets, e.g. ``<backward>``)."""

    file: str
    function: str
    line: int

    @property
    def label(self) -> str:
        """``file:line function`` (``file function`` for a pseudo-site)."""
        where = self.file if self.line == 0 else f"{self.file}:{self.line}"
        return f"{where} {self.function}".rstrip()


#: The row of memory that was already allocated when the trace starts.
PRE_TRACE = Site("<before recording>", "live when the trace starts", 0)
_NO_FRAMES = Site("<no frames>", "", 0)
_NO_PYTHON = Site("<no Python frame>", "", 0)
_USER, _LIBRARY_PY, _CPP = "user", "library", "C++"


class Attributor:
    """Sites and categories of stacks, remembered per stack (the loader shares one tuple
    among all entries with the same stack, so each distinct stack is examined once).

    ``include``: paths or module names (``pkg.mod``) whose frames count as user code even
    inside a library; matched as path components against the recorded file names.
    """

    def __init__(self, include: Iterable[str] = ()) -> None:
        self.include = tuple(include)
        self._patterns = tuple(_pattern(value) for value in self.include)
        self._matched: set[str] = set()
        self._seen: dict[int, tuple[Sequence[Frame], Site, str]] = {}
        self._kinds: dict[int, tuple[Frame, tuple[str, str | None]]] = {}

    def describe(self, frames: Sequence[Frame]) -> tuple[Site, str]:
        """The site and the category (one of ``CATEGORIES``) of one stack."""
        known = self._seen.get(id(frames))
        if known is not None and known[0] is frames:
            return known[1], known[2]
        kinds = self._kinds_of(frames)
        site, category = self._site(frames, kinds), _category(kinds)
        self._seen[id(frames)] = (frames, site, category)
        return site, category

    def unmatched(self) -> tuple[str, ...]:
        """The ``include`` values no stack examined so far matched."""
        return tuple(v for v in self.include if v not in self._matched)

    def site(self, frames: Sequence[Frame]) -> Site:
        """The innermost user frame, else the fallbacks in the module docstring."""
        return self._site(frames, self._kinds_of(frames))

    def category(self, frames: Sequence[Frame]) -> str:
        """The phase of a stack (see the module docstring)."""
        return _category(self._kinds_of(frames))

    def _site(self, frames: Sequence[Frame], kinds: Sequence[tuple[str, str | None]]) -> Site:
        if not frames:
            return _NO_FRAMES
        python = None
        for frame, (kind, _) in zip(frames, kinds):
            if kind == _USER:
                return Site(frame.filename, frame.name, frame.line)
            if kind == _LIBRARY_PY and python is None:
                python = frame
        for frame in frames:
            match = _NODE.search(frame.name) if "autograd" in frame.name else None
            if match:
                return Site("<backward>", match.group(1), 0)
        if python is not None:
            return Site(python.filename, python.name, python.line)
        return _NO_PYTHON

    def _kinds_of(self, frames: Sequence[Frame]) -> list[tuple[str, str | None]]:
        """Per frame: user code, library Python or C++, and the phase the frame alone
        shows; each distinct frame is classified once."""
        cache, out = self._kinds, []
        for frame in frames:
            known = cache.get(id(frame))
            if known is None or known[0] is not frame:
                known = cache[id(frame)] = (frame, self._classify(frame))
            out.append(known[1])
        return out

    def _classify(self, frame: Frame) -> tuple[str, str | None]:
        if frame.filename.endswith(".py"):
            kind = _USER if self.is_user(frame.filename) else _LIBRARY_PY
        else:
            kind = _CPP
        return kind, _phase(frame)

    def is_user(self, filename: str) -> bool:
        """Whether a Python file counts as user code (see the module docstring)."""
        path = "/" + filename.replace("\\", "/").lstrip("/")
        for value, pattern in zip(self.include, self._patterns):
            if pattern + "/" in path or path.endswith((pattern, pattern + ".py")):
                self._matched.add(value)
                return True
        return _LIBRARY.search(path) is None


def _pattern(value: str) -> str:
    text = value.replace("\\", "/").rstrip("/")
    if "/" not in text and not text.endswith(".py"):
        text = text.replace(".", "/")  # a module name: pkg.mod -> pkg/mod
    return "/" + text.lstrip("/")


def _category(kinds: Sequence[tuple[str, str | None]]) -> str:
    phases = {phase for _, phase in kinds}
    for phase in ("optimizer", "backward", "forward"):
        if phase in phases:
            return phase
    return "other"


def _phase(frame: Frame) -> str | None:
    name, file = frame.name, frame.filename.replace("\\", "/")
    if file.endswith(".py"):
        if "/torch/optim/" in file:
            return "optimizer"
        if is_backward_call(frame):
            return "backward"
        if name in ("_call_impl", "_wrapped_call_impl") and file.endswith("torch/nn/modules/module.py"):
            return "forward"
    elif "torch::autograd::Engine" in name or "PythonEngine" in name:
        return "backward"
    return None


def is_backward_call(frame: Frame) -> bool:
    """Whether ``frame`` is a call into backward: ``Tensor.backward`` (``torch/_tensor.py``),
    ``torch.autograd.backward`` or ``torch.autograd.grad`` (``torch/autograd/``)."""
    file = frame.filename.replace("\\", "/")
    if frame.name == "backward":
        return "/torch/autograd/" in file or file.endswith("/torch/_tensor.py")
    return frame.name == "grad" and "/torch/autograd/" in file
