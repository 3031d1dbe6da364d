"""StepOptions: parsed once, shared by the estimator and the measured batch-size path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gpu_mem_track import estimate, find_max_batch_size
from gpu_mem_track.devices import Device
from gpu_mem_track.errors import UsageError
from gpu_mem_track.estimator.options import StepOptions
from gpu_mem_track.estimator.simulate import estimate_step


def test_cli_strings_parse_once_into_names_and_lazy_dtypes():
    options = StepOptions.parse(dtype="bf16", amp="fp16", optimizer="AdamW", training=False, device="cuda:1")
    assert options == StepOptions("bfloat16", "float16", "adamw", False, Device("cuda", 1))
    assert (options.torch_dtype, options.amp_dtype) == (torch.bfloat16, torch.float16)
    assert (options.target, options.optimizer_name) == ("cuda", "adamw")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.amp = None  # type: ignore[misc]


@pytest.mark.parametrize(
    ("amp", "expected"),
    [
        (False, None),
        (None, None),
        (True, "float16"),
        ("fp16", "float16"),
        ("bf16", "bfloat16"),
        (torch.bfloat16, "bfloat16"),
    ],
)
def test_amp_forms(amp, expected):
    assert StepOptions.parse(amp=amp).amp == expected


def test_defaults_and_a_callable_optimizer():
    assert StepOptions.parse() == StepOptions()
    assert StepOptions().torch_dtype is None and StepOptions().amp_dtype is None
    make = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    assert StepOptions.parse(optimizer=make).optimizer is make
    assert StepOptions.parse(optimizer=None).optimizer == "none"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (dict(dtype="fp8"), "unknown dtype 'fp8'"),
        (dict(amp="fp32"), "autocast runs in float16 or bfloat16, not float32"),
        (dict(amp="int4"), "unknown dtype 'int4'"),
        (dict(optimizer="lion"), "unknown optimizer 'lion' (choose from adam, adamw, sgd, none)"),
        (dict(optimizer=3), "optimizer must be a name or a callable, not 3"),
        (dict(device="tpu"), "not a device: 'tpu'"),
    ],
)
def test_bad_options_name_the_value(given, message):
    with pytest.raises(UsageError) as caught:
        StepOptions.parse(**given)
    assert message in str(caught.value)


def _net():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def test_estimate_keywords_build_the_same_options():
    by_keywords = estimate(_net, (4, 8), dtype="bf16", amp="bf16", optimizer="sgd", device="cuda")
    by_record = estimate_step(_net, (4, 8), StepOptions.parse(dtype="bf16", amp="bf16", optimizer="sgd"))
    assert by_keywords == by_record
    assert (by_keywords.dtype, by_keywords.amp, by_keywords.optimizer) == ("bfloat16", True, "sgd")


class _Recording(nn.Module):
    """Records, per forward, the batch and the autocast state it ran under (on the CPU)."""

    seen: list[tuple[int, bool, torch.dtype]] = []

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x):
        _Recording.seen.append(
            (x.shape[0], torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
        )
        return self.layer(x)


@pytest.mark.parametrize(
    ("amp", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16), (True, torch.float16)]
)
def test_measured_batch_size_runs_autocast_with_a_torch_dtype(amp, dtype):
    """``batch-size --measure --amp fp16`` passed the string "fp16" to ``torch.autocast``
    (TypeError); the measured path now gets autocast's dtype from StepOptions."""
    _Recording.seen = []

    def meter(run, device):  # a step's peak growing with its batch, measured on the CPU
        assert device == Device("cpu")
        run()
        return 100 + 10 * _Recording.seen[-1][0]

    result = find_max_batch_size(
        _Recording, [(1, 8)], budget=1000, measure=True, device="cpu", amp=amp, meter=meter
    )
    assert result.batch == 90 and result.source == "measured steps on cpu"
    assert {(enabled, seen) for _, enabled, seen in _Recording.seen} == {(True, dtype)}
    # The batch above the answer is never run when measuring.
    assert 91 not in {batch for batch, _, _ in _Recording.seen}


def test_measured_without_amp_runs_no_autocast():
    _Recording.seen = []
    meter = lambda run, device: (run(), 50 * _Recording.seen[-1][0])[1]  # noqa: E731
    result = find_max_batch_size(_Recording, [(1, 8)], budget=500, measure=True, device="cpu", meter=meter)
    assert result.batch == 10
    assert {enabled for _, enabled, _ in _Recording.seen} == {False}


def test_measuring_on_the_cpu_without_a_meter_is_a_usage_error():
    with pytest.raises(UsageError, match="measured peaks need a CUDA device, not 'cpu'"):
        find_max_batch_size(_Recording, [(1, 8)], budget=1000, measure=True, device="cpu")


def test_warmup_and_the_cuda_memory_options_go_through_step_options():
    given = dict(warmup=0, alloc_conf="max_split_size_mb:64", gpu="hopper", cublas_workspace=":16:8")
    options = StepOptions.parse(optimizer="sgd", **given)
    memory = (options.warmup, options.alloc_conf, options.gpu, options.cublas_workspace)
    assert memory == tuple(given.values())
    by_keywords = estimate(_net, (4, 8), optimizer="sgd", **given)
    assert by_keywords == estimate_step(_net, (4, 8), options)
    assert by_keywords.allocator == "max_split_size_mb:64"
    assert by_keywords.cublas_workspace == 2 * 131_072 + (1 << 20)  # + cuBLASLt's (a biased linear)
    # warmup=0 measures the first step: its optimizer step makes the momentum buffers.
    assert by_keywords.optimizer_state_bytes == estimate(_net, (4, 8), optimizer="sgd").optimizer_state_bytes
    for bad in (-1, 1.5, True):
        with pytest.raises(UsageError, match="warmup must be a count of steps >= 0"):
            StepOptions.parse(warmup=bad)


def test_the_finder_passes_loss_and_memory_options_to_the_estimator():
    def squared(output):
        return (output.repeat(64, 1) ** 2).sum()  # two 256x2 float32 tensors more at the loss

    common = dict(budget=128 * 2**20, device="cuda", gpu="hopper", max_batch=4, budget_on="allocated")
    result = find_max_batch_size(_net, [(1, 8)], loss_fn=squared, **common)
    options = StepOptions.parse(gpu="hopper")
    expected = estimate_step(_net, (4, 8), options, loss_fn=squared).peak
    assert result.batch == 4 and result.peak == expected > 2 * 32 * 2**20  # hopper's workspaces
    assert expected > estimate_step(_net, (4, 8), options).peak
    assert result.source == "estimator (cuda target), peak allocated"
