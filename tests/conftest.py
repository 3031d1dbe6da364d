"""Shared fixtures: CUDA tests skip themselves without CUDA; no test may leave a hook behind."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from dataclasses import dataclass

import pytest
import torch

# The census's native reader is not built behind the tests' backs (no background builds
# into the user's cache): tests/test_native_census.py builds it in a temporary folder and
# runs the census tests again with it.
os.environ.setdefault("GPU_MEM_TRACK_NATIVE", "off")
# The simulated GPU counts the catalog's non-PyTorch memory, not a probe result the
# machine's user saved (tests/test_simgpu_capacity.py turns it on in a temporary folder).
os.environ.setdefault("GPU_MEM_TRACK_SAVED_PROBE", "off")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def _saved_tensor_hooks():
    """This thread's innermost saved-tensor default hooks (None when there are none, or
    when this torch cannot tell)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return None
    try:
        return top(True)
    except TypeError:
        return top()


def _global_module_hooks():
    module = torch.nn.modules.module
    names = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called")
    return {name: list(getattr(module, name, {})) for name in names}


@pytest.fixture(autouse=True)
def no_hooks_left_behind():
    """Fail a test that leaves a trace or profile function, saved-tensor hooks or global
    module hooks installed."""
    trace, profile = sys.gettrace(), sys.getprofile()
    saved, module_hooks = _saved_tensor_hooks(), _global_module_hooks()
    yield
    assert sys.gettrace() is trace, "a test left a trace function installed"
    assert sys.getprofile() is profile, "a test left a profile function installed"
    assert _saved_tensor_hooks() == saved, "a test left saved-tensor hooks installed"
    assert _global_module_hooks() == module_hooks, "a test left global module hooks installed"


@pytest.fixture
def gpu():
    """The GPU a CUDA test runs on: the real one when there is one (yields None), else a
    simulated A100-40GB (yields the running :class:`SimulatedGpu`), so the CUDA paths run
    on every machine."""
    if torch.cuda.is_available():
        yield None
        return
    from gpu_mem_track.simgpu import simulated_gpu

    with simulated_gpu("a100-40gb") as simulated:
        yield simulated


@pytest.fixture
def one_process(monkeypatch):
    """One process: the launcher's rank variables unset (tests that want ranks set them
    themselves), and no model of an earlier test left in a reference cycle (its
    parameters and gradients would count in the census's totals)."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    gc.collect()


@pytest.fixture
def fresh_heap():
    """Free memory given back to the system, for tests whose script must raise the
    process's RSS: earlier tests' garbage collected (a collection during a line would
    offset its rise), then glibc's ``malloc_trim(0)``, which releases the pages of the
    heap's free chunks. Without it a large tensor may land in a free chunk an earlier test
    left in the heap, whose pages are still resident, and raise the RSS by nothing (glibc
    takes a free chunk that is large enough before its mmap threshold is considered)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc: nothing to release
        pass


@pytest.fixture
def probe_result():
    """A probe result whose CUDA context costs 500 MiB (502 MiB driver, 2 MiB reserved)."""
    from gpu_mem_track.tracker.records import ProbeResult, ProbeStage

    mib = 2**20
    stages = (ProbeStage("before CUDA", 0, 0), ProbeStage("CUDA context", 502 * mib, 2 * mib))
    return ProbeResult("cuda:0", "Fake", "nvml process", "2.13.0", stages)


@pytest.fixture
def quiet_tracker(tmp_path):
    """A factory of CPU trackers writing under tmp_path and printing nothing."""
    from gpu_mem_track import MemTracker

    def make(**kwargs):
        options = dict(device="cpu", out_dir=tmp_path / "reports", verbosity=0, probe=False)
        options.update(kwargs)
        return MemTracker(**options)

    return make


@dataclass(frozen=True)
class CliResult:
    """What ``main`` returned and printed; named like ``subprocess.CompletedProcess``."""

    returncode: int | str | None
    stdout: str
    stderr: str


@pytest.fixture
def in_process(capsys):
    """``in_process(*args)`` runs ``python -m gpu_mem_track *args`` in this process (no
    torch import to pay for) and returns a :class:`CliResult`. argparse's own exits
    (``--help``, a bad option) are returned as their exit code."""
    from gpu_mem_track.cli import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            code = main([str(arg) for arg in args])
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
