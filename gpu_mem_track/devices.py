"""A device parsed once: ``Device(type, index)`` and ``parse_device`` for every user input.

Torch-free: a ``torch.device`` is read through its ``type`` and ``index`` attributes, so
the runner can parse ``--device`` without importing torch or starting CUDA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import UsageError

__all__ = ["DEVICE_FORMS", "Device", "parse_device"]

#: The accepted forms, quoted in every error message.
DEVICE_FORMS = "'cpu', 'cuda', 'cuda:N', a CUDA index N >= 0, or a torch.device of type cpu or cuda"

_TEXT = re.compile(r"(cpu|cuda)(?::([0-9]+))?")


@dataclass(frozen=True)
class Device:
    """A CPU or CUDA device. ``index`` is None for the CPU and for "the current CUDA
    device" (``"cuda"``); a CUDA device with a known ordinal has its index (>= 0)."""

    type: str
    index: int | None = None

    def __str__(self) -> str:
        """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (the form ``torch.device`` accepts)."""
        return self.type if self.index is None else f"{self.type}:{self.index}"

    @property
    def is_cuda(self) -> bool:
        """True for any CUDA device, with or without an index."""
        return self.type == "cuda"

    @property
    def ordinal(self) -> int:
        """The CUDA index, 0 when unspecified (what ``torch.device(...).index or 0`` gives)."""
        return self.index or 0

    def with_index(self, index: int = 0) -> Device:
        """This device with ``index`` filled in when it had none (CUDA only)."""
        if self.type != "cuda" or self.index is not None:
            return self
        return Device("cuda", index)


def parse_device(value: Any) -> Device:
    """Parse a device given as ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an ``int`` N (the CUDA
    device N), a ``torch.device`` (duck-typed: ``.type`` and ``.index``) or a ``Device``.

    ``"cpu:0"`` and ``torch.device("cpu", 0)`` mean the CPU (``Device("cpu")``). Raises
    ``UsageError`` naming the bad value and listing the valid forms for anything else
    (a negative index, ``True``, ``"gpu"``, ``"cuda:x"``, an ``mps`` device, ...).
    """
    if isinstance(value, Device):
        return value
    if isinstance(value, bool) or (isinstance(value, int) and value < 0):
        raise UsageError(f"device must be a CUDA index >= 0, not {value!r} (valid forms: {DEVICE_FORMS})")
    if isinstance(value, int):
        return Device("cuda", value)
    if isinstance(value, str):
        match = _TEXT.fullmatch(value.strip())
        if match is None:
            raise UsageError(f"not a device: {value!r} (valid forms: {DEVICE_FORMS})")
        index = None if match.group(2) is None else int(match.group(2))
        return _checked(match.group(1), index, value)
    kind, index = getattr(value, "type", None), getattr(value, "index", None)
    if isinstance(kind, str) and (index is None or (isinstance(index, int) and not isinstance(index, bool))):
        return _checked(kind, index, value)
    raise UsageError(f"not a device: {value!r} (valid forms: {DEVICE_FORMS})")


def _checked(kind: str, index: int | None, value: Any) -> Device:
    if kind == "cpu" and index in (None, 0):
        return Device("cpu")
    if kind == "cuda" and (index is None or index >= 0):
        return Device("cuda", index)
    raise UsageError(f"not a device: {value!r} (valid forms: {DEVICE_FORMS})")
