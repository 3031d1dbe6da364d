"""The two families of issue 27 (scripts/check/): their scripts run, and under the simulated
GPU their backward passes sum gradients and scatter in place as CUDA does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--vocab",
    "64",
    "--context",
    "16",
    "--d-model",
    "32",
    "--layers",
    "2",
    "--heads",
    "4",
    "--d-ff",
    "64",
]


def _script(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts/check" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lm_benchmark_runs_on_the_cpu():
    assert _script("lm_benchmark").main([*TINY, "--device", "cpu", "--steps", "1"]) == 0


def test_the_lm_benchmark_sums_and_scatters_in_place_on_the_simulated_gpu(capsys):
    """Per step: the residual stream's and the normed inputs' gradient sums, each layer's
    softmax max, the loss's max and gather and the embedding's index backward all run in
    place."""
    from gpu_mem_track.simgpu import simulated_gpu

    with simulated_gpu("h200") as gpu:
        _script("lm_benchmark").main([*TINY, "--warmup", "0", "--steps", "2"])
        sums = gpu.storages.sums
    assert sums.summed >= 2 * 2 * 4  # per step and layer: q/k/v's input, the residual stream...
    assert sums.scattered == 2 * (2 + 3)  # per step: 2 softmax maxes; the loss's max, gather; rows
    assert "max_memory_allocated " in capsys.readouterr().out
