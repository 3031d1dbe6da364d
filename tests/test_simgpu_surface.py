"""The ``torch.cuda`` surface inside a simulated GPU, on either wheel: every public name of
the seven modules has a treatment in ``simgpu.surface.SURFACE`` (a new torch's names fail
here, by name), each treatment holds, decorators stay decorators and context managers
context managers, no ``torch._C._cuda_*`` function of torch runs inside a simulation,
and the runner's sampler and the tracker's reader read the simulation, not the GPU."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from gpu_mem_track.simgpu import simulated_gpu
from gpu_mem_track.simgpu.surface import MODULES, SURFACE, NotSimulated, public_names

KINDS = ("simulated", "passthrough", "refused")
ROOT = Path(__file__).resolve().parents[1]


def module(name: str):
    return importlib.import_module(name)


def lookup(qualname: str):
    """What ``module.name`` is now; for a property of a ``PropModule`` (cudnn's switches),
    the property object on its class, so replacing it is seen."""
    owner, _, name = qualname.rpartition(".")
    mod = module(owner)
    if isinstance(mod, torch.backends.PropModule) and name in vars(type(mod)):
        return vars(type(mod))[name]
    return getattr(mod, name)


def present() -> dict[str, object]:
    return {
        f"{name}.{attr}": lookup(f"{name}.{attr}") for name in MODULES for attr in public_names(module(name))
    }


def test_every_public_name_has_a_treatment():
    """A name torch adds (or this table forgets) fails here, named, until the table says
    how the simulation treats it."""
    untreated = sorted(name for name in present() if name not in SURFACE)
    assert untreated == [], f"no simulated/passthrough/refused treatment for: {untreated}"
    assert set(SURFACE.values()) == set(KINDS)


def test_the_table_covers_what_a_training_script_calls():
    for name in ("torch.cuda.max_memory_allocated", "torch.cuda.nvtx.range", "torch.cuda.Event"):
        assert SURFACE[name] == "simulated"
    assert SURFACE["torch.amp.GradScaler"] == "passthrough"
    assert SURFACE["torch.cuda.graph"] == "refused"


def refused_use(value):
    """Use a refused stand-in as a script would: call it, or index it (an object)."""
    if callable(value):
        return value()
    return value[0]


def test_each_treatment_holds_inside_and_everything_is_put_back():
    before = present()
    with simulated_gpu("h100-80gb"):
        inside = {name: lookup(name) for name in before}
        for name, original in before.items():
            kind, now = SURFACE[name], inside[name]
            if kind == "simulated":
                assert now is not original, f"{name} is not replaced"
            elif kind == "passthrough":
                assert now is original or now == original, f"{name} is replaced"
            else:
                with pytest.raises(NotSimulated) as caught:
                    refused_use(now)
                assert str(caught.value).startswith(f"{name} is not supported on the simulated GPU"), name
    after = {name: lookup(name) for name in before}
    assert [name for name, value in before.items() if after[name] is not value and after[name] != value] == []


def test_a_refused_class_still_answers_isinstance_and_names_itself():
    with simulated_gpu("a100-40gb"):
        assert not isinstance(object(), torch.cuda.CUDAGraph)
        with pytest.raises(NotSimulated, match=r"^torch\.cuda\.CUDAGraph is not supported .*CUDA graphs"):
            torch.cuda.CUDAGraph()
        with pytest.raises(NotSimulated, match=r"torch\.cuda\.memory\.MemPool .*memory pools"):
            torch.cuda.memory.MemPool()


def test_nvtx_range_is_a_decorator_and_a_context_manager():
    with simulated_gpu("h100-80gb") as gpu:

        @torch.cuda.nvtx.range("forward {}", 1)
        def forward(x):
            return x * 2

        with torch.cuda.nvtx.range("step"):
            out = forward(torch.ones(1024, device="cuda"))
        assert out.is_cuda and out.shape == (1024,)
        assert gpu.allocator.allocated == 4096  # the output (the input is gone)
        assert torch.cuda.nvtx.range_push("a") == 0 and torch.cuda.nvtx.range_pop() == 0


def test_autocast_and_cudnn_flags_are_decorators_and_context_managers():
    with simulated_gpu("h100-80gb"):
        layer = torch.nn.Linear(64, 64).cuda()

        @torch.autocast("cuda", dtype=torch.bfloat16)
        def forward(x):
            return layer(x)

        @torch.backends.cudnn.flags(enabled=True, benchmark=True)
        def benchmarked():
            return torch.backends.cudnn.benchmark

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp.autocast is deprecated
            with torch.cuda.amp.autocast():
                assert layer(torch.ones(4, 64, device="cuda")).dtype == torch.float16
        assert forward(torch.ones(4, 64, device="cuda")).dtype == torch.bfloat16
        assert benchmarked() is True
        with torch.backends.cudnn.flags(enabled=False):
            assert torch.backends.cudnn.enabled is False
        assert torch.backends.cudnn.benchmark_limit == 10


def test_device_stream_and_event_context_managers():
    with simulated_gpu("a100-40gb"):
        stream = torch.cuda.Stream()
        tensor = torch.zeros(8, device="cuda")
        with torch.cuda.device(0) as device, torch.cuda.stream(stream), torch.cuda.device_of(tensor):
            assert device is not None and torch.cuda.current_device() == 0
        with torch.cuda.StreamContext(stream):
            assert torch.cuda.current_stream() == stream
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        end.synchronize()
        assert start.elapsed_time(end) > 0


def test_simulated_extras_answer_as_a_gpu_would():
    with simulated_gpu("h100-80gb") as gpu:
        assert torch.cuda.get_arch_list() == ["sm_90"]
        assert torch.cuda.get_gencode_flags() == "-gencode compute=compute_90,code=sm_90"
        torch.cuda.set_sync_debug_mode("warn")
        assert torch.cuda.get_sync_debug_mode() == 1
        assert torch.cuda.get_per_process_memory_fraction() == 1.0
        torch.cuda.set_per_process_memory_fraction(0.5)
        assert torch.cuda.get_per_process_memory_fraction() == pytest.approx(0.5)
        pointer = torch.cuda.caching_allocator_alloc(3 << 20)
        assert torch.cuda.memory_allocated() == 3 << 20 and torch.cuda.memory_reserved() == 20 << 20
        # the process holds the allocator's segments and the memory outside it (CUDA context,
        # cuBLAS/cuDNN handles), as mem_get_info's free figure counts them
        used = gpu.allocator.reserved + gpu.spec.context_bytes + gpu.spec.library_bytes
        assert gpu.spec.library_bytes > 0
        assert torch.cuda.device_memory_used() == used
        assert torch.cuda.mem_get_info() == (gpu.spec.total_memory - used, gpu.spec.total_memory)
        assert torch.cuda.list_gpu_processes() == (
            f"GPU:0\nprocess {os.getpid():>10d} uses {used / (1024 * 1024):12.3f} MB GPU memory"
        )
        torch.cuda.caching_allocator_delete(pointer)
        assert torch.cuda.memory_allocated() == 0
        assert torch.backends.cuda.cublas_workspace_size() == gpu.spec.cublas_workspace
        assert torch.backends.cuda.is_flash_attention_available() is True


def test_legacy_cuda_tensor_types_make_simulated_tensors():
    with simulated_gpu("a100-40gb") as gpu:
        sized = torch.cuda.FloatTensor(2, 3)
        data = torch.cuda.LongTensor([1, 2, 3])
        assert sized.shape == (2, 3) and sized.dtype == torch.float32 and sized.is_cuda
        assert data.tolist() == [1, 2, 3] and data.dtype == torch.int64
        assert isinstance(sized, torch.cuda.FloatTensor) and not isinstance(sized, torch.cuda.HalfTensor)
        assert gpu.allocator.allocated == 2 * 512


def test_tensor_type_answers_and_converts_as_on_a_gpu():
    # older scripts: `dtype = torch.cuda.FloatTensor; x.type(dtype)`, `x.type() == "torch.cuda..."`
    with simulated_gpu("a100-40gb") as gpu:
        on_gpu = torch.ones(3, device="cuda")
        assert on_gpu.type() == "torch.cuda.FloatTensor" and torch.ones(3).type() == "torch.FloatTensor"
        assert on_gpu.type(torch.cuda.FloatTensor) is on_gpu  # already that type: itself
        half = torch.ones(4).type(torch.cuda.HalfTensor)
        named = torch.ones(4).type("torch.cuda.DoubleTensor")
        assert (half.device.type, half.dtype, half.type()) == ("cuda", torch.float16, "torch.cuda.HalfTensor")
        assert (named.device.type, named.dtype) == ("cuda", torch.float64)
        assert gpu.allocator.allocated == 3 * 512  # each a block of the simulated GPU
        back = on_gpu.type("torch.DoubleTensor")
        assert back.device.type == "cpu" and back.tolist() == [1.0, 1.0, 1.0]


def guard_real_cuda(monkeypatch) -> list[str]:
    """Make every ``torch._C._cuda_*`` function of this torch record its call and raise
    (the CUDA wheel has ~90; the CPU wheel a few): a simulation that reached one would
    read, initialise or fail on the real GPU."""
    calls: list[str] = []
    for name in [n for n in dir(torch._C) if n.startswith("_cuda_")]:
        original = getattr(torch._C, name)
        if isinstance(original, type) or not callable(original):
            continue

        def real(*args, _name=name, **kwargs):
            calls.append(_name)
            raise AssertionError(f"torch._C.{_name} ran inside the simulation")

        monkeypatch.setattr(torch._C, name, real)
    return calls


def callable_without_arguments(value) -> bool:
    if not (inspect.isfunction(value) or inspect.isbuiltin(value)):
        return False
    try:
        parameters = inspect.signature(value).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)


def workload() -> None:
    """What training scripts call, on the simulated GPU."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.cuda.manual_seed_all(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 4))
    model = model.to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = torch.amp.GradScaler("cuda")
    torch.cuda.memory._record_memory_history(max_entries=100)
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16), torch.cuda.nvtx.range("step"):
            loss = model(torch.randn(4, 3, 16, 16, device="cuda")).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    assert torch.cuda.memory._snapshot()["segments"]
    torch.cuda.memory._record_memory_history(enabled=None)
    assert torch.cuda.max_memory_allocated() > 0 and torch.cuda.memory_stats()["num_ooms"] == 0
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.empty_cache()


def test_no_real_cuda_call_happens_inside_a_simulation(monkeypatch):
    names = sorted(present())
    started = torch.cuda._initialized  # on a GPU machine an earlier test may have started CUDA
    calls = guard_real_cuda(monkeypatch)
    with simulated_gpu("h100-80gb"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated names among the calls below
        workload()
        for name in names:  # this torch's names: the table also names other releases'
            kind, value = SURFACE[name], lookup(name)
            if kind != "refused" and callable_without_arguments(value):
                value()  # each simulated or passed-through function, as a script calls it
    assert calls == []
    assert torch.cuda._initialized is started  # torch's own flag: the simulation started nothing


def test_inside_a_simulation_a_refused_cuda_binding_names_itself():
    if not hasattr(torch._C, "_cuda_getCurrentBlasHandle"):
        pytest.skip("the CPU wheel has no cuBLAS binding to refuse")
    with simulated_gpu("h100-80gb"):
        with pytest.raises(NotSimulated, match=r"^torch\._C\._cuda_getCurrentBlasHandle is not supported"):
            torch._C._cuda_getCurrentBlasHandle()
        assert torch._C._cuda_getDeviceCount() == 1


def test_the_sampler_reads_the_simulation_not_the_gpu(monkeypatch):
    """The failure on the CUDA wheel: the sampler read ``torch._C._cuda_memoryStats``,
    the real allocator (``Invalid device argument`` without a GPU). Here that binding
    raises, on either wheel; the sampler reads the simulation's live counters."""
    from gpu_mem_track.runner.samplers import CudaSampler
    from gpu_mem_track.tracker.readers import FakeReader

    def real(device):
        raise RuntimeError("Invalid device argument")

    monkeypatch.setattr(torch._C, "_cuda_memoryStats", real, raising=False)
    sampler = CudaSampler("cuda:0", reader=FakeReader(rss_bytes=7))
    with simulated_gpu("a100-40gb") as gpu:
        assert sampler.sample() == (0, 0)
        kept = torch.empty(1, device="cuda")
        freed = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        del freed
        assert sampler.sample() == (512, (3 << 20) + 512)
        assert (sampler.reserved, sampler.reserved_peak) == (gpu.allocator.reserved, 22 << 20)
        assert sampler.events == 3  # two allocations and one free
        assert sampler.extras() == (None, 7)  # no driver figure from the real GPU
        del kept


def test_the_tracker_reader_reads_the_simulation_and_never_nvml(monkeypatch):
    from gpu_mem_track.tracker.readers import CudaReader

    nvml = types.ModuleType("pynvml")
    asked: list[str] = []
    nvml.nvmlInit = lambda: asked.append("nvmlInit")
    nvml.nvmlDeviceGetHandleByIndex = lambda index: asked.append("handle")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    reader = CudaReader()
    with simulated_gpu("a100-40gb") as gpu:
        tensor = torch.empty(1000, device="cuda")
        reading = reader.allocator("cuda:0")
        assert reading is not None and reading.allocated == gpu.allocator.allocated == 4096
        assert reader.driver("cuda:0") is None
        del tensor
    assert asked == []


TRAIN = (
    "import torch\n"
    "model = torch.nn.Linear(256, 256).cuda()\n"
    "@torch.cuda.nvtx.range('step')\n"
    "def step():\n"
    "    model(torch.randn(32, 256, device='cuda')).sum().backward()\n"
    "for _ in range(2):\n"
    "    step()\n"
    "print('peak', torch.cuda.max_memory_allocated(), torch.cuda.get_device_name())\n"
)


def test_a_simulated_run_in_process_with_the_nvtx_decorator(tmp_path, monkeypatch, capsys, one_process):
    """``run --simulate`` with the script's idioms, on whichever wheel runs the tests."""
    from gpu_mem_track.cli import main

    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--simulate", "h100-80gb", "--run-to-end", "--run-name", "r", "train.py"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    peak, name = printed.split("\n")[0].split(" ", 2)[1:]
    assert name == "NVIDIA H100 80GB HBM3"
    # two 32 MiB cuBLAS workspaces (forward, backward), cuBLASLt's 1 MiB (the biased linear's addmm,
    # gpumodel.reduce) and < 1 MiB
    assert 65 << 20 < int(peak) < 66 << 20
    assert "Simulated GPU: H100-80GB" in captured.err  # the run's summary


@pytest.mark.slow
def test_run_simulate_with_no_visible_cuda_device(tmp_path):
    """``CUDA_VISIBLE_DEVICES=""``: on the CUDA wheel torch then sees no GPU at all."""
    (tmp_path / "train.py").write_text(TRAIN)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "gpu_mem_track",
        "run",
        "--simulate",
        "h100-80gb",
        "--run-to-end",
        "train.py",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("peak ") and "NVIDIA H100 80GB HBM3" in done.stdout


BESIDE_A_GPU = """
import torch
from gpu_mem_track.simgpu import simulated_gpu

with simulated_gpu("a100-40gb") as gpu:
    model = torch.nn.Linear(1024, 1024).cuda()
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    assert torch.cuda.get_device_name() == "NVIDIA A100-SXM4-40GB" and gpu.allocator.allocated > 0
print(torch.cuda.is_initialized(), torch._C._cuda_hasPrimaryContext(0), torch.cuda.device_count() > 0)
"""


@pytest.mark.cuda
def test_simulating_another_gpu_beside_a_real_one_never_starts_it():
    """In a fresh process with a GPU visible: after a simulated training step CUDA is not
    initialised and device 0 has no context (nothing allocated, nothing read there)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", BESIDE_A_GPU], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]
