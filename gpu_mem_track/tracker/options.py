"""``MemTracker``'s arguments checked, and its device and probe resolved.

Nothing here starts CUDA: whether CUDA is usable is asked of the driver
(``torch.cuda.is_available()`` counts devices and creates no context), and the probe is
only read from its cache (``probe.load_probe``), never measured.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..devices import parse_device
from ..errors import UsageError
from .probe import ProbeResult, load_probe

__all__ = ["Probe", "check_options", "cuda_unavailable_note", "cuda_usable", "label_text", "probe_function"]

Probe = Callable[[str], "ProbeResult | None"]


def check_options(frame: Any, census: str, verbosity: int) -> None:
    """Raise ``UsageError`` naming the first bad argument."""
    if frame is not None and not isinstance(frame, types.FrameType):
        raise UsageError(f"MemTracker's first argument is a frame or None, not {type(frame).__name__}")
    if census not in ("fast", "full"):
        raise UsageError(f"census must be 'fast' or 'full', not {census!r}")
    if verbosity not in (0, 1, 2):
        raise UsageError(f"verbosity must be 0, 1 or 2, not {verbosity!r}")


def label_text(label: object) -> str:
    """A stamp's label as text, whatever ``track()`` was given: None is ``""``; ``0`` and
    ``False`` stay ``"0"`` and ``"False"``; a one-element CPU tensor is its value and another
    tensor its description (``tensor(2x3, float32, cuda:0)``: no device memory is read); any
    other object its ``str()`` (its type's name if that raises). Lone surrogates are
    escaped (``\\udcff``) so the text can be written as UTF-8."""
    if label is None:
        return ""
    if isinstance(label, torch.Tensor):
        text = _tensor_label(label)
    elif isinstance(label, str):
        text = label
    else:
        try:
            text = str(label)
        except Exception:
            text = f"<{type(label).__name__}>"
        if not isinstance(text, str):  # a str() subclass override returning non-str
            text = f"<{type(label).__name__}>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _tensor_label(tensor: torch.Tensor) -> str:
    try:
        with torch._C.DisableTorchFunctionSubclass():
            if tensor.device.type == "cpu" and tensor.numel() == 1 and tensor.layout == torch.strided:
                return str(tensor.item())
            shape = "x".join(str(n) for n in tensor.shape) or "scalar"
            return f"tensor({shape}, {str(tensor.dtype).removeprefix('torch.')}, {tensor.device})"
    except Exception:
        return f"<{type(tensor).__name__}>"


def cuda_usable() -> bool:
    """Whether this torch build and machine can run CUDA (no context is created)."""
    if torch.cuda.is_initialized():
        return True
    return bool(torch.cuda._is_compiled() and torch.cuda.is_available())


def cuda_unavailable_note(asked: str) -> str:
    """The one line saying a CUDA device was asked for where CUDA cannot run."""
    build = "this torch build has no CUDA" if not torch.cuda._is_compiled() else "no CUDA device is visible"
    return (
        f"gpu_mem_track: CUDA is not available here ({build}); {asked} was asked for,"
        " so the stamps report CPU tensors and process RSS"
    )


def probe_function(probe: bool | Probe) -> Probe | None:
    """The probe to ask for a device's CUDA context cost: ``True`` reads the cache."""
    if probe is True:
        return cached_context
    if probe is False or probe is None:
        return None
    if callable(probe):
        return probe
    raise UsageError(f"probe must be True, False or a callable, not {probe!r}")


def cached_context(device: str) -> ProbeResult | None:
    """The probe result already measured for ``device``'s GPU, or None (never measures)."""
    uuid = None
    if torch.cuda.is_initialized():  # the UUID keys the cache; never start CUDA to read it
        try:
            uuid = str(getattr(torch.cuda.get_device_properties(parse_device(device).ordinal), "uuid", ""))
        except Exception:
            uuid = None
    return load_probe(device, uuid or None)


#: The note shown once when no measured probe is cached for a GPU.
PROBE_HINT = (
    "gpu_mem_track: framework cost not split into CUDA context and libraries: no context probe"
    " measured for this GPU yet; run `python -m gpu_mem_track probe --device {device}` once"
    " (it starts a second CUDA context for a few seconds) and later stamps use its result"
)
