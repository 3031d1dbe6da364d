"""The workspaces of plans cuDNN's heuristics chose (``cudnn.benchmark`` off), against the
H200 evidence ``reports/gpu_check/H200/conv_workspaces.txt`` (``scripts/check/conv_workspaces.py``:
torch 2.11, cuDNN 9.19, ``examples.convnet`` at batch 32, 3x32x32; gpumodel.cudnn's
module doc maps each recorded allocation to its convolution)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from gpu_mem_track import examples
from gpu_mem_track.gpumodel.convops import channels_last
from gpu_mem_track.gpumodel.cudnn import ConvProblem, CudnnConvolutions, heuristic_workspace, run_workspace
from gpu_mem_track.simgpu import simulated_gpu

CONV1 = ((32, 3, 32, 32), (32, 3, 3, 3), (32, 32, 32, 32))  # input, weight, output shapes
CONV2 = ((32, 32, 16, 16), (64, 32, 3, 3), (32, 64, 16, 16))


def convnet_problem(kind: str, conv: tuple, itemsize: int, last: bool) -> ConvProblem:
    x, w, y = conv
    return ConvProblem(kind, x, w, y, (1, 1), (1, 1), (1, 1), 1, itemsize, (), last)


# (kind, conv, itemsize, channels-last, recorded bytes, relative tolerance: 0 is exact)
RECORDED = [
    ("forward", CONV1, 4, False, 0, 0),
    ("forward", CONV2, 4, False, 1_122_320, 0),  # X + W + 16
    ("backward_data", CONV2, 4, False, 3_219_472, 0),  # T = X + Y + W + 16
    ("backward_filter", CONV2, 4, False, 7_372_800, 0),  # 100 x W
    ("backward_filter", CONV1, 4, False, 0, 0),
    ("forward", CONV1, 2, False, 0, 0),
    ("forward", CONV2, 2, False, 1_609_744, 0),
    ("backward_data", CONV2, 2, False, 1_609_744, 0),
    ("backward_filter", CONV2, 2, False, 3_445_359, 0.003),  # T + S, S = 50 x W
    ("forward", CONV1, 4, True, 0, 0),
    ("forward", CONV2, 4, True, 0, 0),
    ("backward_data", CONV2, 4, True, 0, 0),
    ("backward_filter", CONV2, 4, True, 3_735_696, 0.014),  # S
    ("backward_filter", CONV1, 4, True, 0, 0),
    ("forward", CONV1, 2, True, 0, 0),
    ("forward", CONV2, 2, True, 0, 0),
    ("backward_data", CONV2, 2, True, 0, 0),
    ("backward_filter", CONV2, 2, True, 1_835_615, 0.005),
]


@pytest.mark.parametrize(("kind", "conv", "itemsize", "last", "recorded", "tolerance"), RECORDED)
def test_heuristic_workspaces_follow_the_h200_convnet_evidence(
    kind, conv, itemsize, last, recorded, tolerance
):
    modelled = heuristic_workspace(convnet_problem(kind, conv, itemsize, last))
    assert modelled == pytest.approx(recorded, rel=tolerance, abs=0)


def test_the_stems_half_precision_weight_gradients_are_the_known_misses():
    nchw = heuristic_workspace(convnet_problem("backward_filter", CONV1, 2, False))
    assert nchw == 196_608 + 2_097_152 + 1_728 + 16  # T; recorded 3,642,283 B (37% under)
    assert heuristic_workspace(convnet_problem("backward_filter", CONV1, 2, True)) == 0  # recorded 61,663


def test_benchmarked_plans_keep_the_resnet_rules():
    problem = convnet_problem("backward_filter", CONV2, 2, False)
    assert run_workspace(problem) == int(1_572_864 * 1.07)
    assert heuristic_workspace(problem) != run_workspace(problem)


def test_a_keys_plan_is_the_one_its_first_call_chose():
    problem = convnet_problem("forward", CONV2, 2, False)
    cache = CudnnConvolutions()
    assert cache.steps(problem, benchmark=False) == cache.steps(problem, benchmark=True)  # no trial later
    assert [s.nbytes for s in cache.steps(problem, benchmark=True)] == [1_609_744]
    fresh = CudnnConvolutions()
    assert [s.action for s in fresh.steps(problem, benchmark=True)] == ["trial", "empty_cache", "workspace"]
    assert fresh.steps(problem, benchmark=False)[0].nbytes == run_workspace(problem)


def test_channels_last_is_the_inputs_or_the_weights_layout():
    x = torch.empty(2, 8, 4, 4, device="meta")
    w = torch.empty(16, 8, 3, 3, device="meta")
    last = torch.channels_last
    assert not channels_last(x, w)
    assert channels_last(x.contiguous(memory_format=last), w)
    assert channels_last(x, w.contiguous(memory_format=last))
    assert not channels_last(torch.empty(2, 1, 4, 4, device="meta"), torch.empty(4, 1, 1, 1, device="meta"))
    volume = torch.empty(2, 8, 2, 4, 4, device="meta").contiguous(memory_format=torch.channels_last_3d)
    assert channels_last(volume, torch.empty(16, 8, 3, 3, 3, device="meta"))


@contextmanager
def benchmark_off():
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def step_workspaces(dtype: torch.dtype, last: bool) -> list[int]:
    """The cuDNN workspaces of the second step of ``scripts/check/conv_workspaces.py``'s convnet
    step, on the simulated H200, in order."""
    fmt = torch.channels_last if last else torch.contiguous_format
    with benchmark_off(), simulated_gpu("h200") as gpu:
        model = examples.convnet().cuda().to(dtype=dtype, memory_format=fmt)
        x = torch.randn(32, 3, 32, 32, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        model(x).float().sum().backward()
        model.zero_grad(set_to_none=True)  # as the script's optimizer.zero_grad()
        gpu.memory.record(True)
        start = len(gpu.memory.history)
        model(x).float().sum().backward()
        entries = [e for e in gpu.memory.history[start:] if e.action in ("alloc", "free_completed")]
        return [
            a.size
            for a, b in zip(entries, entries[1:])
            if a.action == "alloc" and b.action == "free_completed" and b.addr == a.addr
        ]


@pytest.mark.parametrize(
    ("dtype", "last", "expected"),
    [
        (torch.float32, False, [1_122_320, 3_219_472, 100 * 73_728]),
        (torch.float32, True, [50 * 73_728]),
        (torch.float16, False, [1_609_744, 1_609_744, 1_609_744 + 50 * 36_864, 2_295_504]),
        (torch.float16, True, [50 * 36_864]),
    ],
)
def test_the_simulated_convnet_step_takes_the_heuristic_workspaces_in_order(dtype, last, expected):
    assert step_workspaces(dtype, last) == expected


def test_split_sums_are_sized_by_the_weight_not_the_batch():
    # The gpu check's batch-256 float32 run rules out weight-gradient sizes that grow with
    # the batch (module doc); the layout transform does grow with it.
    big = ((256, 32, 16, 16), (64, 32, 3, 3), (256, 64, 16, 16))
    for itemsize, last in ((4, False), (4, True), (2, True)):
        small_one = heuristic_workspace(convnet_problem("backward_filter", CONV2, itemsize, last))
        assert heuristic_workspace(convnet_problem("backward_filter", big, itemsize, last)) == small_one
    transform = heuristic_workspace(convnet_problem("backward_data", big, 4, False))
    assert transform == 8 * (1_048_576 + 2_097_152) + 73_728 + 16
