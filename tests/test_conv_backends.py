"""Which kernel PyTorch runs a CUDA convolution with (``gpumodel.convbackend``: the rules of
``_select_conv_backend`` in ``aten/src/ATen/native/Convolution.cpp``), and what that does
to the estimator and the simulated GPU: a depthwise convolution on PyTorch's own kernel
takes no cuDNN workspace and no ``cudnn.benchmark`` trial; one cuDNN runs keeps them."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from torch import nn

from gpu_mem_track import estimate
from gpu_mem_track.gpumodel.convbackend import ConvCall, cudnn_depthwise_workload, select_backend
from gpu_mem_track.gpumodel.convops import backend, convolution_plan
from gpu_mem_track.simgpu import simulated_gpu

SM80, SM61, SM75 = (8, 0), (6, 1), (7, 5)


def call(
    x=(1, 16, 320, 320),
    w=(16, 1, 3, 3),
    groups=16,
    dtype="float32",
    last=False,
    stride=(1, 1),
    dilation=(1, 1),
    transposed=False,
) -> ConvCall:
    spatial = len(x) - 2
    padding = (1,) * spatial
    return ConvCall(x, w, stride, padding, dilation, transposed, (0,) * spatial, groups, dtype, last)


# (the call, capability, the backend PyTorch picks; the rule of convbackend's module doc)
CASES = [
    (call(), SM80, "CudaDepthwise2d"),  # float32 NCHW depthwise: PyTorch's kernel
    (call(dtype="bfloat16"), SM80, "CudaDepthwise2d"),  # only float16 may take cuDNN in NCHW
    (call(dtype="float16"), SM80, "CudaDepthwise2d"),  # fewer than 32 channels
    (call((1, 64, 56, 56), (64, 1, 3, 3), 64, "float16"), SM80, "Cudnn"),  # stride 1, 3x3, width 56
    (call((1, 64, 56, 56), (64, 1, 3, 3), 64, "float16"), SM61, "CudaDepthwise2d"),  # before Volta
    (call((1, 64, 56, 56), (64, 1, 7, 7), 64, "float16"), SM80, "CudaDepthwise2d"),  # 7x7 filter
    (call((1, 64, 6, 6), (64, 1, 3, 3), 64, "float16"), SM80, "CudaDepthwise2d"),  # narrower than 7
    (call((1, 64, 56, 56), (64, 1, 3, 3), 64, "float16", dilation=(2, 2)), SM80, "CudaDepthwise2d"),
    (call((8, 64, 56, 56), (64, 1, 3, 3), 64, "float16", stride=(2, 2)), SM80, "CudaDepthwise2d"),
    (call((8, 512, 14, 14), (512, 1, 3, 3), 512, "float16", stride=(2, 2)), SM80, "Cudnn"),
    (call(last=True), SM80, "Cudnn"),  # channels-last depthwise: always cuDNN
    (call(last=True), SM61, "Cudnn"),
    (call((1, 16, 320, 320), (32, 1, 3, 3)), SM80, "CudaDepthwise2d"),  # a depth multiplier of 2
    (call((1, 16, 320, 320), (16, 8, 3, 3), groups=2), SM80, "Cudnn"),  # grouped, not depthwise
    (call((1, 16, 320, 320), (16, 16, 1, 1), groups=1), SM80, "Cudnn"),  # pointwise
    (call((4, 16, 1000), (16, 1, 3)), SM80, "CudaDepthwise2d"),  # 1-d, viewed as 2-d
    (call((2, 16, 8, 32, 32), (16, 1, 3, 3, 3)), SM80, "CudaDepthwise3d"),
    (call((2, 16, 8, 32, 32), (16, 1, 3, 3, 3), last=True), SM80, "Cudnn"),
    (call((0, 16, 32, 32)), SM80, "Empty"),
    (call((1, 16, 32, 32), (16, 16, 3, 3), 1, "bfloat16"), SM75, "Slow2d"),  # no bf16 cuDNN before sm80
    (call((1, 16, 32, 32), (16, 16, 3, 3), 1, "bfloat16"), SM80, "Cudnn"),
    (call((1, 16, 32, 32), (16, 16, 3, 3), 1, transposed=True), SM80, "CudnnTranspose"),
    (call((1, 2**27, 4, 4), (2**27, 1, 3, 3), 2**27), SM80, "Cudnn"),  # past 32-bit indexing, NCHW
    (call((1, 2**27, 4, 4), (2**27, 1, 3, 3), 2**27, last=True), SM80, "CudaDepthwise2d"),
]


@pytest.mark.parametrize(("conv", "capability", "picked"), CASES)
def test_the_backend_follows_pytorchs_selection(conv, capability, picked):
    assert select_backend(conv, capability) == picked


def test_without_cudnn_convolutions_run_pytorchs_kernels():
    assert select_backend(call(), SM80, enabled=False) == "CudaDepthwise2d"
    assert select_backend(call(last=True), SM80, enabled=False) == "CudaDepthwise2d"
    assert select_backend(call(w=(16, 16, 3, 3), groups=1), SM80, enabled=False) == "Slow2d"
    assert select_backend(call(w=(16, 16, 3, 3), groups=1, dilation=(2, 2)), SM80, enabled=False) == (
        "SlowDilated2d"
    )
    volume = call((2, 16, 8, 32, 32), (16, 16, 3, 3, 3), groups=1)
    assert select_backend(volume, SM80, enabled=False) == "SlowDilated3d"


def test_the_float16_workload_check_of_cudnn_8_2_and_later():
    def fp16(n, ch, width, kernel, stride):
        return call((n, ch, width, width), (ch, 1, kernel, kernel), ch, "float16", stride=(stride, stride))

    assert cudnn_depthwise_workload(fp16(32, 64, 7, 5, 1))  # stride 1, 1/3/5 filter, width >= 7
    assert not cudnn_depthwise_workload(fp16(32, 64, 7, 5, 3))  # stride 3
    assert cudnn_depthwise_workload(fp16(1, 64, 28, 1, 2)) and not cudnn_depthwise_workload(
        fp16(1, 64, 29, 1, 2)
    )
    assert cudnn_depthwise_workload(fp16(16, 128, 7, 1, 2)) and not cudnn_depthwise_workload(
        fp16(17, 128, 7, 1, 2)
    )
    assert cudnn_depthwise_workload(fp16(8, 256, 28, 3, 2)) and not cudnn_depthwise_workload(
        fp16(8, 256, 27, 3, 2)
    )
    assert cudnn_depthwise_workload(call((4, 64, 1, 100), (64, 1, 1, 9), 64, "float16"))  # height 1


def _meta(shape, dtype=torch.float32, last=False):
    t = torch.empty(shape, device="meta", dtype=dtype)
    return t.contiguous(memory_format=torch.channels_last) if last else t


@contextmanager
def cudnn(benchmark: bool):
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = old


def _plan(dtype, last, func=torch.ops.aten.convolution.default):
    x, w = _meta((1, 64, 56, 56), dtype, last), _meta((64, 1, 3, 3), dtype, last)
    out = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 64)
    if func is torch.ops.aten.convolution.default:
        return convolution_plan(
            func, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 64), out, False, SM80
        )
    args = (out, x, w, [64], [1, 1], [1, 1], [1, 1], False, [0, 0], 64, [True, True, False])
    grads = func(*args)
    return convolution_plan(func, args, grads, True, SM80)


def test_only_convolutions_cudnn_runs_get_cudnn_problems():
    backward = torch.ops.aten.convolution_backward.default
    assert _plan(torch.float32, False) == [] and _plan(torch.float32, False, backward) == []
    assert _plan(torch.bfloat16, False) == [] and _plan(torch.bfloat16, False, backward) == []
    assert [p.kind for _, p in _plan(torch.float16, False)] == ["forward"]  # 64 channels, 3x3, 56 wide
    assert [p.kind for _, p in _plan(torch.float32, True, backward)] == ["backward_data", "backward_filter"]
    assert [p.kind for _, p in _plan(torch.float16, True, backward)] == ["backward_data", "backward_filter"]
    x, w = _meta((1, 64, 56, 56)), _meta((64, 1, 3, 3))
    assert backend(x, w, ([1, 1], [1, 1], [1, 1], False, [0, 0], 64), SM80) == "CudaDepthwise2d"


STATE = (1, 16, 320, 320)
STATE_BYTES = 16 * 320 * 320 * 4


def depthwise_net(blocks: int = 4, pointwise: bool = False) -> nn.Sequential:
    """Blocks of a 3x3 depthwise convolution and a ReLU (and a 1x1 one after it) on a
    16-channel state: the depthwise convolutions run PyTorch's kernel in float32 NCHW."""
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU()]
        if pointwise:
            layers += [nn.Conv2d(16, 16, 1), nn.ReLU()]
    return nn.Sequential(*layers)


def _weights(model: nn.Module) -> int:
    """Parameter bytes as the allocator holds them (each rounded up to 512 B)."""
    return sum(-(-p.numel() * p.element_size() // 512) * 512 for p in model.parameters())


@pytest.mark.parametrize("benchmarked", [False, True])
def test_a_no_grad_depthwise_network_takes_its_outputs_and_weights_only(benchmarked):
    model = depthwise_net()
    with cudnn(benchmarked):
        peak = estimate(model, STATE, training=False).peak
    # the input, a convolution's output and its ReLU's: no workspace, no benchmark trial
    assert peak == 3 * STATE_BYTES + _weights(model)


def _transients(gpu) -> list[int]:
    """Sizes allocated and freed at once since recording began (workspaces, trials, and
    autograd's gradients passed straight on)."""
    entries = [(e.action, e.size) for e in gpu.memory.history if e.action != "free_requested"]
    return [
        size
        for (action, size), (after, freed) in zip(entries, entries[1:])
        if action == "alloc" and after == "free_completed" and freed == size
    ]


def test_a_depthwise_training_step_takes_no_cudnn_workspace():
    def workspaces(pointwise: bool) -> list[int]:  # the state-sized ones are ReLU's gradients
        with simulated_gpu("a100-40gb") as gpu:
            model = depthwise_net(blocks=2, pointwise=pointwise).cuda()
            x = torch.randn(STATE, device="cuda")
            gpu.memory.record(True)
            model(x).sum().backward()
            return [size for size in _transients(gpu) if size != STATE_BYTES]

    # depthwise forward, data and weight gradients on PyTorch's kernels: none
    assert workspaces(pointwise=False) == []
    # each 1x1 convolution runs cuDNN (heuristic NCHW float32 plans): X + W + 16 forward,
    # X + Y + W + 16 for its data gradient, 100 x W for its weight gradient
    w = 16 * 16 * 4  # the 1x1 weight's bytes
    assert workspaces(pointwise=True) == [STATE_BYTES + w + 16] * 2 + [2 * STATE_BYTES + w + 16, 100 * w] * 2


@pytest.mark.parametrize("benchmarked", [False, True])
def test_depthwise_convolutions_cudnn_runs_keep_their_workspaces(benchmarked):
    def workspaces(dtype, last) -> list[int]:
        fmt = torch.channels_last if last else torch.contiguous_format
        with cudnn(benchmarked), simulated_gpu("a100-40gb") as gpu:
            conv = nn.Conv2d(64, 64, 3, padding=1, groups=64).cuda().to(dtype=dtype, memory_format=fmt)
            x = torch.randn(8, 64, 56, 56, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
            gpu.memory.record(True)
            conv(x.requires_grad_()).sum().backward()
            return _transients(gpu)

    assert workspaces(torch.float32, False) == []  # PyTorch's kernel: its outputs only
    assert workspaces(torch.bfloat16, False) == []
    assert workspaces(torch.float16, False)  # float16 NCHW, 64 channels, 3x3, 56 wide: cuDNN
    # channels-last: cuDNN, whose heuristic plans for one input channel per group (a
    # "stem", gpumodel.cudnn) take none in that layout; benchmark's trials it takes
    assert bool(workspaces(torch.float32, True)) == benchmarked


def test_the_gpu_measurement_script_writes_the_modelled_side_without_a_gpu(tmp_path, monkeypatch):
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "check" / "conv_backends.py"
    spec = importlib.util.spec_from_file_location("conv_backends_script", path)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclass looks its module up
    spec.loader.exec_module(script)
    out = tmp_path / "conv.jsonl"
    assert script.main(["--dry", "--limit", "2", "--out", str(out), "--capability", "8.0"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = [r for r in rows if "case" in r]
    assert [(r["benchmark"], r["model_backend"], r["modelled"], r["measured"]) for r in cases] == [
        (benchmark, "CudaDepthwise2d", [[], []], None) for benchmark in (False, False, True, True)
    ]
    networks = {r["network"]: r["estimated"] for r in rows if "network" in r}
    assert (
        networks["depthwise_net"] == estimate(script.depthwise_net(), STATE, training=False, gpu="h200").peak
    )
    assert set(networks) == {"depthwise_net", "inverted_residual"}
