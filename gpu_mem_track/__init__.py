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
    "Categories",
    "Census",
    "GroupChange",
    "Ledger",
    "MemTracker",
    "ProbeResult",
    "SavedTensorRecorder",
    "Stamp",
    "TensorGroup",
    "UsageError",
    "__version__",
    "compare_files",
    "compare_runs",
    "load_run",
    "plot_files",
    "render_comparison",
    "read_stamps",
    "run_probe",
    "take_census",
    "BatchSizeResult",
    "Estimate",
    "InputSpec",
    "estimate",
    "find_max_batch_size",
    "render_batch_size",
    "render_estimate",
    "search_batch_size",
]

_HOMES = {
    "MemTracker": "tracker.memtracker",
    "Categories": "tracker.records",
    "Census": "tracker.records",
    "GroupChange": "tracker.records",
    "Ledger": "tracker.records",
    "Stamp": "tracker.records",
    "TensorGroup": "tracker.records",
    "UsageError": "errors",
    "read_stamps": "tracker.csvlog",
    "ProbeResult": "tracker.probe",
    "run_probe": "tracker.probe",
    "take_census": "tracker.census",
    "SavedTensorRecorder": "tracker.saved",
    "compare_files": "runs.compare",
    "compare_runs": "runs.compare",
    "render_comparison": "runs.compare",
    "load_run": "runs.load",
    "plot_files": "runs.plot",
    "BatchSizeResult": "estimator.records",
    "Estimate": "estimator.records",
    "InputSpec": "estimator.specs",
    "estimate": "estimator.simulate",
    "find_max_batch_size": "estimator.batchsize",
    "render_batch_size": "estimator.render",
    "render_estimate": "estimator.render",
    "search_batch_size": "estimator.batchsize",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
