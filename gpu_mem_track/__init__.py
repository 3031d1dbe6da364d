"""gpu_mem_track: where GPU memory goes, line by line, tensor by tensor, byte by byte.

``MemTracker().track()`` writes line-stamped reports of live tensors with a ledger that
reconciles tensors, the caching allocator and the driver. Names are imported lazily, so
``import gpu_mem_track`` does not import torch until a torch-backed name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "Census",
    "GroupChange",
    "Ledger",
    "MemTracker",
    "ProbeResult",
    "Stamp",
    "TensorGroup",
    "UsageError",
    "__version__",
    "read_stamps",
    "run_probe",
    "take_census",
]

_HOMES = {
    "MemTracker": "tracker",
    "Census": "records",
    "GroupChange": "records",
    "Ledger": "records",
    "Stamp": "records",
    "TensorGroup": "records",
    "UsageError": "errors",
    "read_stamps": "csvlog",
    "ProbeResult": "probe",
    "run_probe": "probe",
    "take_census": "census",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
