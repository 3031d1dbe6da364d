"""The CUDA allocator's statistics read natively (``gpu_mem_track.native.cudastats``, the
module ``cuda_stats``) and the runner's CUDA sampler that uses it: with a fake torch and a
fake module everywhere; built and loaded for real on a CUDA build of torch (no GPU
needed); compared with torch's dict on a real GPU (``cuda`` marker)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from gpu_mem_track.native import build, cudastats
from gpu_mem_track.runner.samplers import CudaSampler

CUDA_BUILD = bool(torch.version.cuda)


def nested(allocated=0, allocated_peak=0, reserved=0, reserved_peak=0, allocs=0, frees=0):
    """A statistics dict shaped as ``torch._C._cuda_memoryStats`` returns it (the parts
    read, and one more family, as the real one has about 20)."""
    stat = lambda current, peak: {"current": current, "peak": peak, "allocated": 0, "freed": 0}  # noqa: E731
    return {
        "allocated_bytes": {"all": stat(allocated, allocated_peak), "small_pool": stat(0, 0)},
        "reserved_bytes": {"all": stat(reserved, reserved_peak), "small_pool": stat(0, 0)},
        "allocation": {
            "all": {"current": allocs - frees, "peak": allocs, "allocated": allocs, "freed": frees}
        },
        "segment": {"all": stat(1, 1)},
    }


class FakeTorch:
    """A torch whose CUDA is started and whose allocator holds ``self.figures``."""

    def __init__(self, figures=(512, 1024, 2 << 20, 2 << 20, 3)) -> None:
        self.figures = figures
        self.dict_reads = 0

        def memory_stats(index):
            self.dict_reads += 1
            a, ap, r, rp, events = self.figures
            return nested(a, ap, r, rp, allocs=events, frees=0)

        def memory_stats_as_nested_dict(device=None):
            return memory_stats(0)

        memory_stats_as_nested_dict.__module__ = "torch.cuda.memory"  # as torch's own
        self._C = SimpleNamespace(_cuda_memoryStats=memory_stats)
        self.cuda = SimpleNamespace(
            is_initialized=lambda: True, memory_stats_as_nested_dict=memory_stats_as_nested_dict
        )


class FakeModule:
    """A ``cuda_stats`` module reading ``torch.figures`` (plus ``skew`` on the first figure)."""

    ABI = cudastats.ABI

    def __init__(self, torch_: FakeTorch, skew: int = 0) -> None:
        self.torch = torch_
        self.skew = skew
        self.reads = 0

    def read(self, index):
        self.reads += 1
        a, *rest = self.torch.figures
        return (a + self.skew, *rest)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test starts with nothing loaded, checked or being built."""
    monkeypatch.setattr(cudastats, "_state", cudastats._fresh_state())


def test_figures_are_read_from_the_dict_as_the_sampler_always_read_them():
    stats = nested(
        allocated=512, allocated_peak=4096, reserved=2 << 20, reserved_peak=4 << 20, allocs=7, frees=5
    )
    assert cudastats.figures(stats) == (512, 4096, 2 << 20, 4 << 20, 12)


def test_a_reader_that_agrees_with_the_dict_is_used_and_the_note_says_so():
    fake = FakeTorch()
    module = FakeModule(fake)
    read = cudastats.checked_read(0, fake._C._cuda_memoryStats, module)
    assert read == module.read
    assert read(0) == (512, 1024, 2 << 20, 2 << 20, 3)
    assert cudastats.status() == "in use: reads as torch._C._cuda_memoryStats does on cuda:0"
    reads = module.reads
    assert cudastats.checked_read(0, fake._C._cuda_memoryStats, module) == module.read
    assert module.reads == reads  # checked once per device


def test_a_reader_that_disagrees_is_never_used():
    fake = FakeTorch()
    module = FakeModule(fake, skew=512)
    assert cudastats.checked_read(1, fake._C._cuda_memoryStats, module) is None
    assert cudastats.status() == (
        "not used: checked against torch._C._cuda_memoryStats on cuda:1: "
        f"read (1024, 1024, {2 << 20}, {2 << 20}, 3), the dict (512, 1024, {2 << 20}, {2 << 20}, 3)"
    )


def test_a_reader_that_raises_is_not_used():
    class Raising:
        def read(self, index):
            raise RuntimeError("Invalid device argument ")

    assert cudastats.checked_read(0, FakeTorch()._C._cuda_memoryStats, Raising()) is None
    assert cudastats.status() == (
        "not used: checked against torch._C._cuda_memoryStats on cuda:0: "
        "cannot compare: RuntimeError: Invalid device argument"
    )


def test_an_allocator_that_moves_at_every_comparison_is_not_trusted():
    fake = FakeTorch()

    class Moving(FakeModule):
        def read(self, index):
            fake.figures = (fake.figures[0] + 512, *fake.figures[1:])  # another thread allocating
            return super().read(index)

    assert cudastats.checked_read(0, fake._C._cuda_memoryStats, Moving(fake)) is None
    assert cudastats.status().endswith(f"moved during each of {cudastats.CHECK_TRIES} comparisons")


def test_figures_all_zero_prove_nothing_and_the_check_waits_for_an_allocation(monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    fake = FakeTorch(figures=(0, 0, 0, 0, 0))  # CUDA started, nothing allocated yet
    wrong = FakeModule(fake)  # a reader of some other, idle allocator: zeros too
    monkeypatch.setattr(cudastats, "_load", lambda: (wrong, "loaded"))
    assert cudastats.checked_read(0, fake._C._cuda_memoryStats) is None
    assert cudastats.awaiting(0)
    assert cudastats.status() == "not checked yet: nothing allocated on cuda:0 to compare"
    fake.figures = (512, 512, 2 << 20, 2 << 20, 1)
    wrong.torch = FakeTorch(figures=(0, 0, 0, 0, 0))  # it still reads zeros: refused now
    assert cudastats.checked_read(0, fake._C._cuda_memoryStats) is None
    assert not cudastats.awaiting(0)
    assert cudastats.status().startswith("not used: checked against torch._C._cuda_memoryStats on cuda:0")


def test_the_sampler_checks_the_reader_again_once_the_device_has_allocated(monkeypatch):
    monkeypatch.setattr(CudaSampler, "LOOK_EVERY", 3)
    fake = FakeTorch(figures=(0, 0, 0, 0, 0))
    module = FakeModule(fake)
    sampler = CudaSampler("cuda:0", reader=object(), torch_module=fake, native=module)
    assert sampler.sample() == (0, 0)
    assert sampler.stats_reader == "dict"  # zeros: not checked yet
    fake.figures = (512, 1024, 2 << 20, 2 << 20, 3)
    for _ in range(3):
        sampler.sample()
    assert sampler.stats_reader == "native"
    assert cudastats.status() == "in use: reads as torch._C._cuda_memoryStats does on cuda:0"


def test_the_sampler_reads_natively_once_cuda_has_started_and_the_reader_agrees():
    fake = FakeTorch()
    module = FakeModule(fake)
    sampler = CudaSampler("cuda:0", reader=object(), torch_module=fake, native=module)
    assert sampler.sample() == (512, 1024)  # the first sample: the dict, then the check
    assert sampler.stats_reader == "native"
    dict_reads = fake.dict_reads
    fake.figures = (4096, 8192, 4 << 20, 6 << 20, 9)
    assert sampler.sample() == (4096, 8192)
    assert (sampler.reserved, sampler.reserved_peak, sampler.events) == (4 << 20, 6 << 20, 9)
    assert fake.dict_reads == dict_reads  # no dict built any more


def test_the_sampler_keeps_the_dict_when_the_reader_disagrees():
    fake = FakeTorch()
    module = FakeModule(fake, skew=512)
    sampler = CudaSampler("cuda:0", reader=object(), torch_module=fake, native=module)
    sampler.sample()
    fake.figures = (4096, 8192, 4 << 20, 6 << 20, 9)
    reads = module.reads
    assert sampler.sample() == (4096, 8192)
    assert (sampler.stats_reader, sampler.reserved, sampler.events) == ("dict", 4 << 20, 9)
    assert module.reads == reads


def test_the_sampler_never_reads_natively_before_cuda_has_started():
    fake = FakeTorch()
    fake.cuda.is_initialized = lambda: False
    module = FakeModule(fake)
    sampler = CudaSampler("cuda:0", reader=object(), torch_module=fake, native=module)
    assert sampler.sample() == (0, 0)
    assert (module.reads, fake.dict_reads, sampler.stats_reader) == (0, 0, "dict")


def test_a_simulated_gpu_or_given_statistics_are_never_read_natively():
    simulated = FakeTorch()
    simulated.cuda.memory_stats_as_nested_dict.__module__ = "gpu_mem_track.simgpu.cudaapi"
    module = FakeModule(simulated)
    sampler = CudaSampler("cuda:0", reader=object(), torch_module=simulated, native=module)
    assert sampler.sample() == (512, 1024)
    assert (sampler.stats_reader, module.reads) == ("dict", 0)
    given = FakeTorch()
    sampler = CudaSampler(
        "cuda:0", reader=object(), stats=given._C._cuda_memoryStats, native=FakeModule(given)
    )
    assert sampler.sample() == (512, 1024)
    assert sampler.stats_reader == "dict"


def test_off_means_no_native_read_and_no_build(monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "off")
    started = []
    monkeypatch.setattr(cudastats, "start_build", lambda name: started.append(name))
    monkeypatch.setattr(cudastats, "_load", lambda: pytest.fail("looked for the module"))
    fake = FakeTorch()
    sampler = CudaSampler("cuda:0", reader=object(), torch_module=fake)
    assert sampler.sample() == (512, 1024)
    assert (sampler.stats_reader, started) == ("dict", [])
    assert cudastats.status() == "off (GPU_MEM_TRACK_NATIVE=off)"


def test_a_missing_reader_is_built_in_the_background_and_used_once_built(monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    fake = FakeTorch()
    module = FakeModule(fake)

    class Build:  # the background build: running until `done`
        done = False

        def poll(self):
            return 0 if self.done else None

    builder = Build()
    started = []
    monkeypatch.setattr(cudastats, "start_build", lambda name: started.append(name) or builder)
    monkeypatch.setattr(
        cudastats, "_load", lambda: (module, "loaded") if builder.done else (None, "not built")
    )
    monkeypatch.setattr(CudaSampler, "LOOK_EVERY", 3)
    sampler = CudaSampler("cuda:0", reader=object(), torch_module=fake)
    for _ in range(4):
        sampler.sample()
    assert (started, sampler.stats_reader, cudastats.status()) == (
        ["cuda_stats"],
        "dict",
        "being built in the background",
    )
    builder.done = True
    for _ in range(3):
        sampler.sample()
    assert sampler.stats_reader == "native"
    assert started == ["cuda_stats"]  # one build a process
    reads = module.reads
    fake.figures = (1 << 20, 2 << 20, 4 << 20, 4 << 20, 11)
    assert sampler.sample() == (1 << 20, 2 << 20)
    assert module.reads == reads + 1


@pytest.mark.skipif(CUDA_BUILD, reason="this torch is a CUDA build")
def test_on_a_cpu_build_of_torch_the_cuda_reader_is_not_built(tmp_path):
    target = build.plan(tmp_path, build.CUDA_MODULE)
    assert target.missing == "this torch is not a CUDA build"
    done = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track.native.build", "--module", "cuda_stats"],
        capture_output=True,
        text=True,
        env={**os.environ, "GPU_MEM_TRACK_CACHE": str(tmp_path)},
        check=False,
    )
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "cannot build the CUDA statistics reader: this torch is not a CUDA build",
    )


@pytest.fixture(scope="session")
def cuda_stats_module(tmp_path_factory):
    """The module built here for this torch (a CUDA build with a compiler)."""
    if not CUDA_BUILD:
        pytest.skip("this torch is not a CUDA build")
    root = tmp_path_factory.mktemp("native-cuda")
    target = build.plan(root, build.CUDA_MODULE)
    if target.missing:
        pytest.skip(f"the CUDA statistics reader cannot be built here: {target.missing}")
    target = build.build(root, name=build.CUDA_MODULE)
    assert target.built, (target.folder / "build.log").read_text()[-3000:]
    return target


def test_the_module_builds_for_a_cuda_torch_and_never_starts_cuda(cuda_stats_module, tmp_path):
    # A fresh process: load the module, read before CUDA has started (an error, not a start).
    script = tmp_path / "load.py"
    script.write_text(
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('cuda_stats', {str(cuda_stats_module.module)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(module.ABI, module.TORCH == torch.__version__)\n"
        "try:\n    module.read(0)\n"
        "except RuntimeError as error:\n    print('RuntimeError', str(error).strip())\n"
        "print(torch.cuda.is_initialized())\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{cudastats.ABI} True",
        "RuntimeError Invalid device argument",
        "False",
    ]


@pytest.mark.cuda
def test_the_native_read_gives_what_torch_dict_gives_on_a_real_gpu(cuda_stats_module, monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(cuda_stats_module.folder.parents[1]))
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    module = cudastats.module()
    assert module is not None, cudastats.status()
    index = torch.cuda.current_device()
    kept = [torch.empty(1, device="cuda"), torch.empty(3 << 20, dtype=torch.uint8, device="cuda")]
    del kept[0]
    assert module.read(index) == cudastats.figures(torch._C._cuda_memoryStats(index))
    assert cudastats.checked_read(index, torch._C._cuda_memoryStats) == module.read
    sampler = CudaSampler(f"cuda:{index}")
    before = sampler.sample()
    assert sampler.stats_reader == "native", cudastats.status()
    kept.append(torch.empty(5 << 20, dtype=torch.uint8, device="cuda"))
    after = sampler.sample()
    assert after[0] - before[0] >= 5 << 20  # a cached block up to 1 MiB larger may serve it
    assert after == (torch.cuda.memory_allocated(index), torch.cuda.max_memory_allocated(index))


def test_a_build_another_rank_holds_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))

    class Ended:  # this process's build: it found the lock taken and ended at once
        def poll(self):
            return 0

    assert not cudastats.building()
    cudastats._state["builder"] = Ended()
    assert not cudastats.building()
    lock = build.plan(name=build.CUDA_MODULE).folder / ".lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("12345")
    assert cudastats.building()
    lock.unlink()
    assert not cudastats.building()


@pytest.mark.parametrize(
    ("source", "note"),
    [
        (
            f"ABI = {cudastats.ABI}\nTORCH = '2.13.0'\n",
            "loaded from {path}, not checked yet (needs a GPU in use)",
        ),
        (f"ABI = {cudastats.ABI}\nTORCH = '2.0.0'\n", "{path} was built for another version"),
        ("ABI = 0\nTORCH = '2.13.0'\n", "{path} was built for another version"),
        (
            "raise ImportError('undefined symbol: x')\n",
            "cannot load {path}: ImportError: undefined symbol: x",
        ),
    ],
)
def test_a_built_module_is_used_only_when_built_for_this_abi_and_torch(tmp_path, monkeypatch, source, note):
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    path = tmp_path / "cuda_stats.py"  # a Python file stands in for the built extension
    path.write_text(source)
    plan = build.BuildPlan(tmp_path, path, "2.13.0", "")
    monkeypatch.setattr(build, "plan", lambda root=None, name=build.MODULE: plan)
    found = cudastats.module()
    assert cudastats.status() == note.format(path=path)
    assert (found is not None) == note.startswith("loaded")
