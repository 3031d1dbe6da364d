"""gpu_mem_track: where GPU memory goes, line by line, tensor by tensor, byte by byte.

``MemTracker().track()`` writes line-stamped reports of live tensors with a ledger that
reconciles tensors, the caching allocator and the driver; ``prepare_run`` and
``execute_run`` run a script under the line profiler; ``compare_files`` and
``plot_files`` read runs back; ``estimate`` and ``find_max_batch_size`` work without a
GPU; ``with simulated_gpu("a100-40gb"):`` runs any code on a simulated GPU. Names are
imported lazily, so ``import gpu_mem_track`` does not import torch until a torch-backed
name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # the real types for type checkers; at run time see __getattr__
    from .devices import Device
    from .errors import UsageError
    from .estimator.batchsize import find_max_batch_size, search_batch_size
    from .estimator.records import BatchSizeResult, Estimate
    from .estimator.render import render_batch_size, render_estimate
    from .estimator.simulate import estimate
    from .estimator.specs import InputSpec
    from .runner.records import RunResult
    from .runner.run import PreparedRun, RunOptions
    from .runner.run import execute as execute_run
    from .runner.run import prepare as prepare_run
    from .runs.compare import compare_files, compare_runs, render_comparison
    from .runs.load import load_run
    from .runs.plot import plot_files
    from .simgpu.session import simulated_gpu
    from .tracker.census import LiveTensorFinder, TensorSource, full_scan, take_census
    from .tracker.csvlog import read_stamps
    from .tracker.memtracker import MemTracker
    from .tracker.probe import ProbeResult, run_probe
    from .tracker.readers import CudaReader, FakeReader, MemoryReader, ProcessReader
    from .tracker.records import Categories, Census, GroupChange, Ledger, Stamp, TensorGroup
    from .tracker.saved import SavedTensorRecorder

#: Where each exported name lives: ``"module"`` (same name) or ``"module:attribute"``.
_HOMES = {
    "MemTracker": "tracker.memtracker",
    "Categories": "tracker.records",
    "Census": "tracker.records",
    "GroupChange": "tracker.records",
    "Ledger": "tracker.records",
    "Stamp": "tracker.records",
    "TensorGroup": "tracker.records",
    "UsageError": "errors",
    "Device": "devices",
    "read_stamps": "tracker.csvlog",
    "ProbeResult": "tracker.probe",
    "run_probe": "tracker.probe",
    "LiveTensorFinder": "tracker.census",
    "TensorSource": "tracker.census",
    "full_scan": "tracker.census",
    "take_census": "tracker.census",
    "CudaReader": "tracker.readers",
    "FakeReader": "tracker.readers",
    "MemoryReader": "tracker.readers",
    "ProcessReader": "tracker.readers",
    "SavedTensorRecorder": "tracker.saved",
    "RunOptions": "runner.run",
    "PreparedRun": "runner.run",
    "prepare_run": "runner.run:prepare",
    "execute_run": "runner.run:execute",
    "RunResult": "runner.records",
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
    "simulated_gpu": "simgpu.session",
}

__all__ = [
    "__version__",
    "MemTracker",
    "Categories",
    "Census",
    "GroupChange",
    "Ledger",
    "Stamp",
    "TensorGroup",
    "UsageError",
    "Device",
    "read_stamps",
    "ProbeResult",
    "run_probe",
    "LiveTensorFinder",
    "TensorSource",
    "full_scan",
    "take_census",
    "CudaReader",
    "FakeReader",
    "MemoryReader",
    "ProcessReader",
    "SavedTensorRecorder",
    "RunOptions",
    "PreparedRun",
    "prepare_run",
    "execute_run",
    "RunResult",
    "compare_files",
    "compare_runs",
    "render_comparison",
    "load_run",
    "plot_files",
    "BatchSizeResult",
    "Estimate",
    "InputSpec",
    "estimate",
    "find_max_batch_size",
    "render_batch_size",
    "render_estimate",
    "search_batch_size",
    "simulated_gpu",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        module, _, attribute = _HOMES[name].partition(":")
        value = getattr(importlib.import_module(f".{module}", __name__), attribute or name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpu_mem_track``: the ``%memtrack`` and ``%%memtrack`` magics (see
    ``gpu_mem_track.notebook``; needs IPython)."""
    from .notebook import load_ipython_extension as load

    load(ipython)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
