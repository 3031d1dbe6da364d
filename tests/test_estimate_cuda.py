"""On a CUDA GPU: the estimator within 5% of a real step's ``max_memory_allocated``.
Without one, the same checks run on the simulated GPU (the ``gpu`` fixture): there they
compare the estimator with the simulation.

Each model's real step is the estimator's: two identical Adam (foreach) steps, the peak of
the second measured above the memory allocated before the model was built, after cuBLAS
and cuDNN were warmed so their persistent workspaces are in that baseline.
"""

from __future__ import annotations

import gc

import pytest
import torch

from gpu_mem_track import estimate, examples, find_max_batch_size
from gpu_mem_track.estimator.specs import InputSpec
from gpu_mem_track.estimator.step import build_model, make_inputs, make_optimizer, run_steps, split_named

CASES = [
    ("convnet", (32, 3, 32, 32)),
    ("resnet", (16, 3, 32, 32)),
    ("transformer", (8, 64, 128)),
    ("mlp", (64, 784)),
    ("lstm", (16, 32, 64)),
]


def _warm(device: torch.device) -> None:
    """Create the cuBLAS (and cuBLASLt) workspaces and the cuDNN handle."""
    layer = torch.nn.Linear(64, 64, device=device)
    layer(torch.randn(8, 64, device=device)).sum().backward()
    conv = torch.nn.Conv2d(3, 4, 3, device=device)
    conv(torch.randn(1, 3, 8, 8, device=device)).sum().backward()
    torch.cuda.synchronize(device)


def measured_peak(name: str, shape: tuple[int, ...], device: torch.device) -> int:
    """Peak bytes allocated during the second of two real training steps, above the baseline."""
    return measured_step_peak(getattr(examples, name), [InputSpec(shape)], device)


def measured_step_peak(factory, specs: list[InputSpec], device: torch.device) -> int:  # noqa: ANN001
    """:func:`measured_peak` for any factory and inputs (keyword inputs by name)."""
    _warm(device)
    gc.collect()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    model = build_model(factory, str(device))
    params = list(model.parameters())
    optimizer = make_optimizer("adam", params, "cuda")
    args, kwargs = split_named(specs, make_inputs(specs, str(device), None))

    def on_phase(phase: str, step: int) -> None:
        if phase == "step start" and step == 1:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)

    run_steps(lambda: model(*args, **kwargs), params, optimizer, on_phase=on_phase)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base  # the model dies on return


@pytest.mark.slow
@pytest.mark.parametrize(("name", "shape"), CASES)
def test_estimate_within_5_percent_of_max_memory_allocated(name, shape, gpu):
    device = torch.device("cuda")
    measured = measured_peak(name, shape, device)
    # The warmed cuBLAS workspaces are in the measured baseline: leave them out here, after
    # the estimate (estimating without them moved blocks: the mlp's first-layer weight then
    # missed the 20 MiB workspace segment's remainder, handed whole with 704 KiB of slack).
    est = estimate(getattr(examples, name), shape, device="cuda")
    estimated = est.peak - est.cublas_workspace
    assert abs(estimated / measured - 1) <= 0.05, (
        f"{name}: estimated {estimated:,} B, measured {measured:,} B"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama", "tiny_bert"])
def test_hugging_face_estimate_within_5_percent_with_math_attention(name, gpu):
    pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpu_mem_track.examples import hf

    specs = [InputSpec((8, 128), torch.int64), InputSpec((8, 128), torch.int64, "labels")]
    device = torch.device("cuda")
    with sdpa_kernel(SDPBackend.MATH):  # the same attention for both
        measured = measured_step_peak(getattr(hf, name), specs, device)
        est = estimate(getattr(hf, name), specs, device="cuda")
    estimated = est.peak - est.cublas_workspace  # as above
    assert abs(estimated / measured - 1) <= 0.05, (
        f"{name}: estimated {estimated:,} B, measured {measured:,} B"
    )


def test_measured_finder_answer_fits_the_budget(gpu):
    budget = 256 * 2**20
    result = find_max_batch_size(examples.mlp, [(1, 784)], budget=budget, measure=True)
    assert result.batch > 4 and result.peak <= budget
    assert all(p.peak is not None for p in result.probes)  # no out-of-memory probe
