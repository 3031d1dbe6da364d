"""The batch-size finder: few probes, the right answer, checked against the estimator."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from gpu_mem_track import estimate, find_max_batch_size, search_batch_size
from gpu_mem_track.errors import UsageError
from gpu_mem_track.estimator.records import BatchProbe, BatchSizeResult
from gpu_mem_track.estimator.render import render_batch_size
from gpu_mem_track.gpumodel.workspace import workspace_bytes


class Counting:
    """A peak function that records every batch it is asked about."""

    def __init__(self, peak):
        self.peak, self.calls = peak, []

    def __call__(self, batch):
        self.calls.append(batch)
        return self.peak(batch)


def test_a_linear_peak_is_found_with_the_samples_two_jumps_and_one_confirmation():
    peak = Counting(lambda b: 1000 + 100 * b)
    result = search_batch_size(peak, 10_000)
    assert result.batch == 90 and result.peak == 10_000 and result.margin == 0
    # The first jump goes at most 16x past the samples (64), the second lands on 90.
    assert peak.calls == [1, 2, 4, 64, 90, 91]
    assert (result.intercept, result.slope) == (1000.0, 100.0)


def test_the_line_near_the_answer_is_not_one_block_over_one_sample():
    # 896 B per sample in 512 B blocks: the answer and the batch above it differ by one
    # block or two, so a line through those two reads 2 KiB per sample and a negative start.
    peak = Counting(lambda b: 35_840 + 512 * math.ceil(b * 896 / 512))
    result = search_batch_size(peak, 100 * 2**20)
    assert result.probes[-1].batch == result.batch + 1  # confirmed just above
    assert 0 < result.intercept < 40_000 and 890 < result.slope < 900


def test_a_rounded_peak_with_a_flat_start_takes_few_probes():
    # Flat (optimizer-bound) up to batch 50, then 4 KiB blocks of 300 B per sample.
    peak = Counting(lambda b: max(2_000_000, 1_000_000 + 4096 * math.ceil(b * 300 / 4096)))
    budget = 50_000_000
    result = search_batch_size(peak, budget)
    assert peak.peak(result.batch) <= budget < peak.peak(result.batch + 1)
    assert len(peak.calls) <= 14


def test_out_of_memory_probes_are_rare_not_a_loop():
    # None means "the step did not run" (a caught OOM): above 5000 the device fails below budget.
    peak = Counting(lambda b: None if b > 5000 else 10_000 * b)
    result = search_batch_size(peak, 10**8, max_batch=10**6)
    assert result.batch == 5000
    assert sum(peak.peak(b) is None for b in peak.calls) <= 4
    assert len(peak.calls) <= 20


def test_a_stepped_peak_is_bisected_to_the_exact_answer():
    # Reserved-like: 2 MiB steps, one step per 100 samples.
    peak = Counting(lambda b: (20 + 2 * (b // 100)) * 2**20)
    result = search_batch_size(peak, 65 * 2**20)
    assert result.batch == 2299 and peak.peak(2300) > 65 * 2**20
    assert len(peak.calls) <= 16
    # With the budget on a step itself, lines through the plateau say nothing: still exact.
    peak = Counting(lambda b: (20 + 2 * (b // 100)) * 2**20)
    result = search_batch_size(peak, 64 * 2**20)
    assert result.batch == 2299 and len(peak.calls) <= 24


def test_nothing_fits():
    result = search_batch_size(lambda b: 100 * b, 50)
    assert (result.batch, result.peak, result.margin) == (0, None, None)
    assert [p.batch for p in result.probes] == [1]
    assert render_batch_size(result) == (
        "not even batch 1 fits the 50 B budget: its step peaks at 100 B\n"
        "peaks from: custom; budget from: given\n"
        "probes (1): 1: 100 B (over budget)\n"
    )  # no line fitted to a single probe
    failed = render_batch_size(search_batch_size(lambda b: None, 50))
    assert failed.startswith("not even batch 1 fits the 50 B budget: its step did not run (out of memory)\n")


def test_without_confirming_above_the_slope_must_predict_the_next_batch_overflows():
    peak = Counting(lambda b: 1000 + 100 * b)
    result = search_batch_size(peak, 10_050, confirm_above=False)
    assert result.batch == 90 and peak.calls == [1, 2, 4, 64, 90]


def small_mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


# The ids avoid the word "cuda", which marks a test as needing a GPU.
@pytest.mark.parametrize(
    ("device", "budget_on", "budget"),
    [
        ("cpu", "reserved", 3 * 2**20),
        pytest.param("cuda", "allocated", 20 * 2**20, id="gpu-target-allocated"),
        pytest.param("cuda", "reserved", 30 * 2**20, id="gpu-target-reserved"),
    ],
)
@pytest.mark.slow
def test_the_answer_agrees_with_the_estimator_at_that_batch(device, budget_on, budget):
    result = find_max_batch_size(small_mlp, [(1, 64)], budget=budget, device=device, budget_on=budget_on)
    # Reserved memory grows in whole segments: a stepped peak, narrowed by bisection.
    stepped = device == "cuda" and budget_on == "reserved"
    assert result.batch > 4 and len(result.probes) <= (20 if stepped else 12)

    def peak(batch):
        est = estimate(small_mlp, (batch, 64), device=device)
        return est.reserved_peak if budget_on == "reserved" and device == "cuda" else est.peak

    at, above = peak(result.batch), peak(result.batch + 1)
    assert at == result.peak and at <= budget < above
    assert result.margin == budget - at and result.budget_source == "given"


@pytest.mark.slow
def test_reserved_budget_fits_fewer_samples_than_allocated():
    # Reserved memory holds whole segments (and the workspaces' 20 MiB segment), so the
    # same budget fits a smaller batch when it limits reserved bytes.
    budget = 40 * 2**20
    on_reserved = find_max_batch_size(small_mlp, [(1, 64)], budget=budget, budget_on="reserved")
    on_allocated = find_max_batch_size(small_mlp, [(1, 64)], budget=budget, budget_on="allocated")
    assert 0 < on_reserved.batch < on_allocated.batch
    assert on_reserved.source == "estimator (cuda target), peak reserved"
    with pytest.raises(UsageError, match="budget_on must be one of reserved, allocated"):
        find_max_batch_size(small_mlp, [(1, 64)], budget=budget, budget_on="requested")


def test_finder_usage_mistakes():
    with pytest.raises(UsageError, match="give a budget"):
        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA device whose free memory is the default")
        find_max_batch_size(small_mlp, [(1, 64)])
    with pytest.raises(UsageError, match="either a model"):
        find_max_batch_size(budget=10)
    with pytest.raises(UsageError, match="the memory budget must be positive, not 0 B"):
        search_batch_size(lambda b: b, 0)
    with pytest.raises(UsageError, match="sample batches must be positive and ascending"):
        search_batch_size(lambda b: b, 10, samples=(2, 1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_measuring_needs_cuda():
    with pytest.raises(UsageError, match="measured peaks need a CUDA device, not 'cpu'"):
        find_max_batch_size(step=lambda b: None, budget=2**30, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA device is available here"):
            find_max_batch_size(step=lambda b: None, budget=2**30, device="cuda")


@pytest.mark.slow
def test_measured_on_the_gpu_the_probes_are_the_estimators(gpu):
    """Measured peaks count from the state before the search, so every probe counts the
    cuBLAS workspace as a fresh run would, and a reserved peak is not hidden by the cache
    an earlier probe left (it read 0 B: every probe after the first "fitted")."""
    if gpu is None:
        pytest.skip("compares with the simulated GPU's own allocator model")
    budget = 256 * 2**20
    measured = find_max_batch_size(small_mlp, [(1, 64)], budget=budget, measure=True)
    estimated = find_max_batch_size(small_mlp, [(1, 64)], budget=budget, gpu="ampere")
    assert measured.source == "measured steps on cuda, peak reserved"
    assert measured.probes == estimated.probes and measured.batch == estimated.batch > 0
    assert all(p.peak >= 22 * 2**20 for p in measured.probes)  # the workspace's 20 MiB segment too
    held = torch.cuda.memory_reserved()
    allocated = find_max_batch_size(
        small_mlp, [(1, 64)], budget=64 * 2**20, measure=True, budget_on="allocated"
    )
    assert allocated.peak <= 64 * 2**20 and torch.cuda.memory_reserved() <= held + 64 * 2**20


def test_cli_batch_size_measures_on_the_gpu(in_process, gpu):
    args = ["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "64MiB", "--json"]
    done = in_process(*args, "--measure")
    major, minor = torch.cuda.get_device_capability()
    if workspace_bytes("hopper" if (major, minor) == (9, 0) else None) * 2 >= 64 * 2**20:
        # Hopper: the forward's and the backward's 32 MiB cuBLAS workspaces take the budget.
        assert_nothing_fits_on_hopper(done, f"{major}.{minor}")
        return
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["source"] == "measured steps on cuda, peak reserved"
    fits = [p for p in data["probes"] if p["peak"] is not None and p["peak"] <= 64 * 2**20]
    assert data["batch"] == max(p["batch"] for p in fits) and data["peak"] <= 64 * 2**20
    assert min(p["peak"] for p in data["probes"]) > 20 * 2**20  # each counts the workspace


def assert_nothing_fits_on_hopper(done, capability: str) -> None:
    """batch-size --measure of the mlp at a 64 MiB budget where its cuBLAS workspaces are 32 MiB."""
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["batch"] == 0 and data["peak"] is None and data["probes"][0]["batch"] == 1
    first = data["probes"][0]["peak"]
    assert first > 64 * 2**20  # the workspaces and the model's own bytes
    assert done.stderr == (
        f"gpu_mem_track: no batch fits the 64.00 MiB budget: batch 1's step peaks at {first:,} B "
        f"(reserved), counting the cuBLAS workspaces its matmuls create on cuda (compute capability "
        f"{capability}): 2 x 32.00 MiB whatever the batch, which alone take the whole budget "
        "(CUBLAS_WORKSPACE_CONFIG sets their size)\n"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the test above measures the real one")
def test_cli_batch_size_says_why_nothing_fits_on_a_simulated_hopper(in_process, monkeypatch):
    from gpu_mem_track.simgpu import simulated_gpu

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    args = ["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "64MiB", "--json"]
    with simulated_gpu("h100-80gb"):
        done = in_process(*args, "--measure")
    assert_nothing_fits_on_hopper(done, "9.0")


def test_result_round_trips_and_renders():
    result = BatchSizeResult(
        90,
        10_000,
        10_000,
        0,
        1000.0,
        100.0,
        (BatchProbe(1, 1100), BatchProbe(91, None), BatchProbe(92, 10_001)),
        "s",
        "given",
    )
    assert BatchSizeResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert render_batch_size(result) == (
        "largest batch that fits: 90 (peak 9.77 KiB of 9.77 KiB budget, margin 0 B)\n"
        "fit near the answer: peak(batch) ~ 1000 B + 100 B x batch\n"
        "peaks from: s; budget from: given\n"
        "probes (3): 1: 1.07 KiB, 91: failed, 92: 10,001 B (over budget)\n"
    )


@pytest.mark.parametrize("where", ["in process", pytest.param("subprocess", marks=pytest.mark.slow)])
def test_cli_batch_size_prints_json(in_process, where):
    args = ["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "64MiB", "--json"]
    if where == "in process":
        done = in_process(*args)
    else:
        command = [sys.executable, "-m", "gpu_mem_track", *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    from gpu_mem_track.examples import mlp

    # The budget limits reserved memory by default.
    assert estimate(mlp, (data["batch"], 784)).reserved_peak == data["peak"] <= 64 * 2**20
    assert estimate(mlp, (data["batch"] + 1, 784)).reserved_peak > 64 * 2**20


@pytest.mark.slow
def test_cli_batch_size_on_allocated(in_process):
    args = ["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "64MiB", "--json"]
    done = in_process(*args, "--budget-on", "allocated", "--cublas-workspace", "0")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    from gpu_mem_track.examples import mlp

    assert estimate(mlp, (data["batch"], 784), cublas_workspace=0).peak == data["peak"] <= 64 * 2**20
    assert estimate(mlp, (data["batch"] + 1, 784), cublas_workspace=0).peak > 64 * 2**20
    assert data["source"] == "estimator (cuda target), peak allocated"


def test_cli_batch_size_mistakes_exit_2(capsys):
    from gpu_mem_track.cli import main

    assert main(["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "lots"]) == 2
    assert "not a byte size: 'lots'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784"]) == 2
        assert "give a budget" in capsys.readouterr().err


def test_cli_batch_size_exits_1_when_no_batch_fits(capsys):
    from gpu_mem_track.cli import main

    assert main(["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "1KiB"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("not even batch 1 fits the 1.00 KiB (1,024 B) budget: its step peaks at ")
    assert "fit" not in out.split("\n", 1)[1] and "probes (1): 1: " in out


def test_cli_batch_size_budget_zero_says_the_budget_must_be_positive(capsys):
    from gpu_mem_track.cli import main

    assert main(["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "0"]) == 2
    assert capsys.readouterr().err == "gpu_mem_track: the memory budget must be positive, not 0 B\n"


STEP_FILE = """
def keep_last_output(model, optimizer, inputs):
    optimizer.zero_grad()
    out = model(*inputs)
    out.sum().backward()
    optimizer.step()
    return out
"""


@pytest.mark.slow
def test_cli_batch_size_with_a_user_step(tmp_path, in_process):
    steps = tmp_path / "steps.py"
    steps.write_text(STEP_FILE)
    args = ["batch-size", "gpu_mem_track.examples:mlp", "--input", "1x784", "--budget", "16MiB", "--json"]
    done = in_process(*args, "--device", "cpu", "--step", f"{steps}:keep_last_output")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    from gpu_mem_track.estimator.specs import load_factory
    from gpu_mem_track.examples import mlp

    step = load_factory(f"{steps}:keep_last_output")
    at = estimate(mlp, (data["batch"], 784), device="cpu", step=step).peak
    assert at == data["peak"] <= 16 * 2**20
    assert estimate(mlp, (data["batch"] + 1, 784), device="cpu", step=step).peak > 16 * 2**20
    # The built-in step frees its output before backward: a larger batch fits.
    builtin = find_max_batch_size(mlp, [(1, 784)], budget=16 * 2**20, device="cpu")
    assert builtin.batch > data["batch"]
