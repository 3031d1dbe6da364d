"""cuDNN's convolution workspaces and ``cudnn.benchmark`` trials on the simulated GPU
(gpumodel.cudnn, gpumodel.convops, the hook in simgpu.engine): each rule on a small
convnet, and the sizes against what the H200 ResNet-50 recording allocated."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

from gpu_mem_track.gpumodel.cudnn import (
    SPLIT_K,
    ConvProblem,
    CudnnConvolutions,
    run_workspace,
    trial_workspace,
)
from gpu_mem_track.simgpu import simulated_gpu

HALF = torch.float16


@contextmanager
def cudnn_flags(benchmark: bool = False, deterministic: bool = False, enabled: bool = True):
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.enabled)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.enabled = enabled
    try:
        yield
    finally:
        cudnn = torch.backends.cudnn
        cudnn.benchmark, cudnn.deterministic, cudnn.enabled = saved


def actions(gpu, start: int = 0) -> list[tuple[str, int]]:
    """(action, size) of the trace entries recorded since ``start``, frees as one entry."""
    return [(e.action, e.size) for e in gpu.memory.history[start:] if e.action != "free_requested"]


def transient(entries: list[tuple[str, int]]) -> list[int]:
    """Sizes allocated and freed at once (the next entry frees it)."""
    return [
        size
        for (action, size), (after, freed) in zip(entries, entries[1:])
        if action == "alloc" and after == "free_completed" and freed == size
    ]


def conv_inputs(batch: int = 8, channels: int = 16, size: int = 32):
    x = torch.randn(batch, channels, size, size, device="cuda", dtype=HALF)
    w = torch.randn(32, channels, 3, 3, device="cuda", dtype=HALF)
    return x, w


X, Y = 8 * 16 * 32 * 32 * 2, 8 * 32 * 32 * 32 * 2  # the 3x3 convolution's input and output bytes
W = 32 * 16 * 3 * 3 * 2
T = X + Y + W + 16  # a heuristic NCHW plan's layout transform (benchmark off)


def test_a_convolution_allocates_its_workspace_after_its_output_and_frees_it_inside():
    with cudnn_flags(), simulated_gpu("h200") as gpu:
        x, w = conv_inputs()
        gpu.memory.record(True)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = F.conv2d(x, w, padding=1)
        entries = actions(gpu)
        assert [s for a, s in entries if a == "alloc"] == [Y, T]  # the output, then the workspace
        assert transient(entries) == [T]
        assert torch.cuda.memory_allocated() - before == y.untyped_storage().nbytes() == Y
        assert torch.cuda.max_memory_allocated() - before == Y + 796_160  # T in 512 B blocks


def test_backward_takes_the_data_gradient_its_workspace_then_the_weight_gradient_its_workspace():
    with cudnn_flags(), simulated_gpu("h200") as gpu:
        x, w = conv_inputs()
        x.requires_grad_()
        w.requires_grad_()
        y = F.conv2d(x, w, padding=1)
        grad = torch.ones_like(y)
        start = len(gpu.memory.history) if gpu.memory.history else 0
        gpu.memory.record(True)
        y.backward(grad)
        allocs = [s for a, s in actions(gpu, start) if a == "alloc"]
        assert allocs[:4] == [X, T, W, T + 50 * W]


def test_benchmark_trials_once_per_key_then_empties_the_cache():
    with cudnn_flags(benchmark=True), simulated_gpu("h200") as gpu:
        x, w = conv_inputs()
        gpu.memory.record(True)
        spare = torch.empty(4 << 20, device="cuda")  # a cached segment for emptyCache to release
        del spare
        first = len(gpu.memory.history)
        F.conv2d(x, w, padding=1)
        entries = actions(gpu, first)
        trial = int((X + Y) * 1.4)
        assert transient(entries) == [trial, X + Y]
        assert ("segment_free", 16 << 20) in entries  # emptyCache() after the trial
        assert entries.index(("segment_free", 16 << 20)) > entries.index(("alloc", trial))
        second = len(gpu.memory.history)
        F.conv2d(x, w, padding=1)  # the same key: the cached plan only
        assert transient(actions(gpu, second)) == [X + Y]
        third = len(gpu.memory.history)
        F.conv2d(x[:4], w, padding=1)  # a new shape: a new trial
        assert transient(actions(gpu, third)) == [(X + Y) * 7 // 10, (X + Y) // 2]


def test_without_benchmark_there_are_no_trials_and_no_cache_release():
    with cudnn_flags(benchmark=False), simulated_gpu("h200") as gpu:
        x, w = conv_inputs()
        gpu.memory.record(True)
        for _ in range(2):
            F.conv2d(x, w, padding=1)
        entries = actions(gpu)
        assert transient(entries) == [T, T]
        assert not any(a == "segment_free" for a, _ in entries)


def test_deterministic_mode_is_part_of_the_benchmark_key():
    with cudnn_flags(benchmark=True), simulated_gpu("h200") as gpu:
        x, w = conv_inputs()
        F.conv2d(x, w, padding=1)
        gpu.memory.record(True)
        torch.backends.cudnn.deterministic = True
        F.conv2d(x, w, padding=1)
        assert transient(actions(gpu)) == [int((X + Y) * 1.4), X + Y]  # a trial again


def test_with_cudnn_disabled_no_workspace_is_taken():
    with cudnn_flags(benchmark=True, enabled=False), simulated_gpu("h200") as gpu:
        x, w = conv_inputs()
        gpu.memory.record(True)
        y = F.conv2d(x, w, padding=1)
        assert [s for a, s in actions(gpu) if a == "alloc"] == [y.untyped_storage().nbytes()]


def test_a_real_cpu_convolution_inside_the_simulation_takes_nothing_from_the_gpu():
    with cudnn_flags(benchmark=True), simulated_gpu("h200") as gpu:
        gpu.memory.record(True)
        y = F.conv2d(torch.randn(2, 3, 16, 16), torch.randn(4, 3, 3, 3))
        assert y.device.type == "cpu" and actions(gpu) == []
        assert torch.cuda.max_memory_allocated() == 0


def test_a_trial_that_does_not_fit_is_halved_and_is_not_the_runs_out_of_memory():
    with cudnn_flags(benchmark=True), simulated_gpu("1GiB:sm90") as gpu:
        x = torch.randn(64, 64, 64, 64, device="cuda", dtype=HALF)  # 32 MiB
        w = torch.randn(64, 64, 3, 3, device="cuda", dtype=HALF)
        hold = torch.empty(int(gpu.spec.capacity * 0.9) // 4, device="cuda")
        gpu.memory.record(True)
        y = F.conv2d(x, w, padding=1)
        trial = transient(actions(gpu))[0]
        assert trial < int((x.nbytes + y.nbytes) * 1.4) and gpu.out_of_memory is None
        assert trial <= gpu.spec.capacity - int(gpu.spec.capacity * 0.9) // 4 * 4
        del hold


def test_a_small_convnet_trains_with_its_workspaces_inside_the_peak_only():
    model_layers = [torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1)]
    with cudnn_flags(benchmark=True), simulated_gpu("h200"):
        model = torch.nn.Sequential(*model_layers).cuda()
        x = torch.randn(4, 3, 64, 64, device="cuda")
        for _ in range(2):
            model(x).sum().backward()
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        params = sum(p.untyped_storage().nbytes() * 2 for p in model.parameters())  # and gradients
        assert held == pytest.approx(params + x.untyped_storage().nbytes(), abs=8 * 512)  # nothing kept
        assert torch.cuda.max_memory_allocated() > held


# The sizes against the H200 ResNet-50 recording (timm-resnet50-amp: fp16, batch 128, NCHW).


def problem(kind, cin, cout, k, stride, size, batch=128, pad=None):
    out = (size + 2 * (k // 2 if pad is None else pad) - k) // stride + 1
    pad = k // 2 if pad is None else pad
    return ConvProblem(
        kind,
        (batch, cin, size, size),
        (cout, cin, k, k),
        (batch, cout, out, out),
        (stride, stride),
        (pad, pad),
        (1, 1),
        1,
        2,
    )


@pytest.mark.parametrize(
    ("kind", "cin", "cout", "k", "stride", "size", "recorded"),
    [
        ("forward", 3, 64, 7, 2, 288, 424_698_384),  # the stem
        ("forward", 64, 64, 3, 1, 72, 169_943_187),  # layer1 3x3
        ("forward", 256, 512, 1, 2, 72, 509_608_083),  # layer2 downsample (strided 1x1)
        ("forward", 2048, 512, 1, 1, 9, 53_084_307),  # layer4 1x1 at 9x9
        ("backward_data", 1024, 2048, 1, 2, 18, 127_402_131),
        ("backward_filter", 512, 512, 3, 2, 18, 65_667_823),
        ("backward_filter", 256, 1024, 1, 1, 18, 109_314_607),  # pointwise 18x18: no split-K
        ("backward_filter", 3, 64, 7, 2, 288, 425_100_399),
    ],
)
def test_run_workspaces_follow_the_recording_within_its_spread(kind, cin, cout, k, stride, size, recorded):
    modelled = run_workspace(problem(kind, cin, cout, k, stride, size))
    assert modelled / recorded == pytest.approx(1, abs=0.15)


def test_large_pointwise_convolutions_run_without_workspace_and_split_their_weight_gradient():
    forward = problem("forward", 64, 256, 1, 1, 72)
    assert run_workspace(forward) == 0  # recorded 272 B
    assert run_workspace(problem("backward_data", 256, 64, 1, 1, 72)) == 0  # recorded 272 B
    filt = problem("backward_filter", 64, 256, 1, 1, 72)
    assert run_workspace(filt) == SPLIT_K * 64 * 256 * 2 == 8_388_608  # recorded 8,388,880 B
    assert run_workspace(problem("backward_filter", 512, 256, 1, 1, 36)) == 67_108_864  # recorded 67,109,136


def test_trials_follow_the_recording_and_come_once_per_key():
    pointwise = problem("forward", 256, 64, 1, 1, 72)
    assert trial_workspace(pointwise) == 424_673_536 - 256  # recorded: X + Y + 256 B
    three = problem("forward", 128, 128, 3, 2, 72)
    assert trial_workspace(three) / 297_607_855 == pytest.approx(1, abs=0.02)
    cache = CudnnConvolutions()
    assert [s.action for s in cache.steps(three, benchmark=True)] == ["trial", "empty_cache", "workspace"]
    assert [s.action for s in cache.steps(three, benchmark=True)] == ["workspace"]
    assert [s.action for s in cache.steps(pointwise, benchmark=True, empty_cache=False)] == ["trial"]
    assert [s.action for s in CudnnConvolutions().steps(three, benchmark=False)] == ["workspace"]


def _h200_trace(name: str) -> list[dict] | None:
    """A recorded H200 trace from ``shared/fixtures/h200`` beside the checkout (or one level
    up, for a worktree), as ``scripts/check/check_resnet.py`` finds it; None when absent."""
    import gzip
    import pickle
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for up in (root.parent, root.parent.parent):
        path = up / "shared/fixtures/h200" / name
        if path.is_file():
            with gzip.open(path) as f:
                return pickle.load(f)["device_traces"][0]
    return None


def resnet50_forward_problems(batch: int = 128, size: int = 288) -> list[ConvProblem]:
    """ResNet-50's 53 convolutions in forward order (timm's layout, NCHW, fp16)."""
    problems = [problem("forward", 3, 64, 7, 2, size, batch)]
    size, inplanes = (size // 2 + 1) // 2, 64
    for stage, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for block in range(blocks):
            stride = 2 if stage and not block else 1
            problems.append(problem("forward", inplanes, planes, 1, 1, size, batch))
            problems.append(problem("forward", planes, planes, 3, stride, size, batch))
            out = (size - 1) // stride + 1
            problems.append(problem("forward", planes, planes * 4, 1, 1, out, batch))
            if not block:
                problems.append(problem("forward", inplanes, planes * 4, 1, stride, size, batch, pad=0))
            inplanes, size = planes * 4, out
    return problems


def test_the_recorded_resnet_trialled_each_forward_key_once_and_emptied_the_cache_only_then():
    trace = _h200_trace("timm-resnet50-amp.pickle.gz")
    if trace is None:
        pytest.skip("the H200 recordings (shared/fixtures/h200) are not beside this checkout")
    entries = [e for e in trace if e["action"] != "free_requested"]
    in_conv = [bool(e["frames"]) and e["frames"][0]["name"] == "_conv_forward" for e in entries]
    stems = [i for i, e in enumerate(entries) if in_conv[i] and e["action"] == "alloc" and e["size"] == 18816]
    per_pass = []
    for start, end in zip(stems, [*stems[1:], len(entries)]):
        conv = [i for i in range(start, end) if in_conv[i]]
        freed_at_once = sum(
            1
            for i in conv
            if entries[i]["action"] == "alloc"
            and entries[i + 1]["action"] == "free_completed"
            and entries[i + 1]["addr"] == entries[i]["addr"]
        )
        released = sum(1 for i in conv if entries[i]["action"] == "segment_free")
        per_pass.append((freed_at_once, released))
    cache = CudnnConvolutions()
    trials = sum(
        step.action == "trial" for p in resnet50_forward_problems() for step in cache.steps(p, benchmark=True)
    )
    assert len(per_pass) == 8 and trials == 23
    first, later = per_pass[0], per_pass[1:]
    assert all(p == later[0] and p[1] == 0 for p in later)  # no trial, no cache release
    assert first[0] - later[0][0] == trials and first[1] > 0  # one trial per key, then releases
