"""gpu_mem_track: where GPU memory goes, line by line, tensor by tensor, byte by byte.

``MemTracker().track()`` writes line-stamped reports of live tensors with a ledger that
reconciles tensors, the caching allocator and the driver; ``prepare_run`` and
``execute_run`` run a script under the line profiler; ``load_run``, ``compare_files`` and
``plot_files`` read runs back; ``estimate`` and ``find_max_batch_size`` work without a
GPU, and ``with simulated_gpu("a100-40gb"):`` runs any code on a simulated one;
``fit`` says what change would make a script fit on a simulated GPU, and
``fit_distributed`` on how many, with which sharding;
``load_snapshot`` reads a PyTorch memory snapshot; ``HFMemTrackCallback`` and
``LightningMemTrackCallback`` stamp a trainer's steps. Names are imported lazily, so
``import gpu_mem_track`` does not import torch (nor a trainer framework) until a name
that needs it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:  # the real types for type checkers; at run time see __getattr__
    from .advisor.api import fit
    from .advisor.distributed import fit_distributed
    from .errors import UsageError
    from .estimator.batchsize import find_max_batch_size, search_batch_size
    from .estimator.render import render_estimate
    from .estimator.simulate import estimate
    from .estimator.specs import InputSpec
    from .integrations.hf import HFMemTrackCallback
    from .integrations.lightning import LightningMemTrackCallback
    from .runner.options import RunOptions
    from .runner.run import execute as execute_run
    from .runner.run import prepare as prepare_run
    from .runs.compare import compare_files, render_comparison
    from .runs.load import load_run
    from .runs.plot import plot_files
    from .simgpu.session import simulated_gpu
    from .snapshotfile.load import load_snapshot
    from .tracker.csvlog import read_stamps
    from .tracker.memtracker import MemTracker
    from .tracker.records import Stamp

#: Where each exported name lives: ``"module"`` (same name) or ``"module:attribute"``.
#: Only what a user calls (or catches); the records, readers, census sources and the
#: runner's plumbing stay importable from their subpackages.
_HOMES = {
    "MemTracker": "tracker.memtracker",
    "Stamp": "tracker.records",
    "read_stamps": "tracker.csvlog",
    "UsageError": "errors",
    "RunOptions": "runner.options",
    "prepare_run": "runner.run:prepare",
    "execute_run": "runner.run:execute",
    "load_run": "runs.load",
    "compare_files": "runs.compare",
    "render_comparison": "runs.compare",
    "plot_files": "runs.plot",
    "estimate": "estimator.simulate",
    "render_estimate": "estimator.render",
    "InputSpec": "estimator.specs",
    "find_max_batch_size": "estimator.batchsize",
    "search_batch_size": "estimator.batchsize",
    "fit": "advisor.api",
    "fit_distributed": "advisor.distributed",
    "load_snapshot": "snapshotfile.load",
    "simulated_gpu": "simgpu.session",
    "HFMemTrackCallback": "integrations.hf",
    "LightningMemTrackCallback": "integrations.lightning",
}

__all__ = [
    "__version__",
    "MemTracker",
    "Stamp",
    "read_stamps",
    "UsageError",
    "RunOptions",
    "prepare_run",
    "execute_run",
    "load_run",
    "compare_files",
    "render_comparison",
    "plot_files",
    "estimate",
    "render_estimate",
    "InputSpec",
    "find_max_batch_size",
    "search_batch_size",
    "fit",
    "fit_distributed",
    "load_snapshot",
    "simulated_gpu",
    "HFMemTrackCallback",
    "LightningMemTrackCallback",
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
