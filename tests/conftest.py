"""Shared fixtures: CUDA tests skip themselves without CUDA; no test may leave a hook behind."""

from __future__ import annotations

import sys

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_hooks_left_behind():
    """Fail a test that leaves a trace or profile function installed."""
    trace, profile = sys.gettrace(), sys.getprofile()
    yield
    assert sys.gettrace() is trace, "a test left a trace function installed"
    assert sys.getprofile() is profile, "a test left a profile function installed"


@pytest.fixture
def probe_result():
    """A probe result whose CUDA context costs 500 MiB (502 MiB driver, 2 MiB reserved)."""
    from gpu_mem_track.records import ProbeResult, ProbeStage

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
