"""``run --memory tensors``: live CPU tensor storages and their high-water mark, exact per line."""

from __future__ import annotations

import socket

import pytest
import torch
from test_runner import folder, run, write

from gpu_mem_track.devices import Device
from gpu_mem_track.errors import UsageError
from gpu_mem_track.runfolder.files import read_lines, read_meta
from gpu_mem_track.runner.checks import check_memory
from gpu_mem_track.runner.tensorbytes import TensorSampler

MIB = 2**20


def test_sampler_counts_births_and_deaths_with_an_exact_high_water_mark():
    sampler = TensorSampler()
    try:
        start = sampler.sample()
        x = torch.empty(2**20)  # 4 MiB
        view = x[10:]  # same storage: adds nothing
        assert sampler.sample() == (start[0] + 4 * MIB, max(start[1], start[0] + 4 * MIB))
        temporary = torch.ones(2**21)  # 8 MiB
        del temporary
        assert sampler.sample() == (start[0] + 4 * MIB, start[0] + 12 * MIB)
        del x, view
        assert sampler.sample() == (start[0], start[0] + 12 * MIB)
        assert sampler.events == 4  # two births, two deaths
    finally:
        sampler.close()
    after = torch.empty(2**10)  # the mode is gone: nothing counted
    assert sampler.sample() == (start[0], start[0] + 12 * MIB) and after.numel() == 2**10


def test_sampler_follows_storage_resizes_as_fsdp2_makes_them():
    before = torch.UntypedStorage.resize_
    sampler = TensorSampler()
    try:
        start = sampler.sample()[0]
        unsharded = torch.empty(2**20)  # 4 MiB, an all-gather output
        unsharded.untyped_storage().resize_(0)  # resharded: freed in place
        assert sampler.sample() == (start, start + 4 * MIB)
        unsharded.untyped_storage().resize_(8 * MIB)  # gathered again, larger
        assert sampler.sample() == (start + 8 * MIB, start + 8 * MIB)
        unsharded.resize_(2**19)  # an aten resize_ that shrinks the tensor keeps the storage
        grown = torch.empty(0)
        grown.resize_(2**18)  # an aten resize_ that grows it: 1 MiB
        assert sampler.sample() == (start + 9 * MIB, start + 9 * MIB)
        del unsharded, grown  # each death gives back its size now, not its size at birth
        assert sampler.sample() == (start, start + 9 * MIB)
    finally:
        sampler.close()
    assert torch.UntypedStorage.resize_ == before  # unwrapped
    assert "resize_" not in torch.UntypedStorage.__dict__


def test_sampler_ignores_storages_on_other_devices():
    sampler = TensorSampler()
    try:
        meta = torch.empty(2**20, device="meta")
        assert sampler.sample() == (0, 0) and meta.numel() == 2**20
    finally:
        sampler.close()


@pytest.mark.parametrize("memory", ["heap", "tensors"])
def test_cpu_memory_choices_are_refused_on_a_cuda_device(memory):
    with pytest.raises(UsageError, match=f"--memory {memory} measures the CPU; on cuda:0"):
        check_memory(memory, Device("cuda", 0))


@pytest.mark.slow
def test_run_reports_exact_tensor_bytes_per_line(tmp_path):
    script = write(
        tmp_path / "tensors.py",
        """
        import torch


        def transient():
            scratch = torch.ones(2**21)
            return scratch.numel()  # no new tensor: the peak is the two storages exactly


        x = torch.empty(2**20)
        total = transient()
        del x
        """,
    )
    done = run(tmp_path, "--memory", "tensors", str(script))
    assert done.returncode == 0, done.stderr
    assert "memory: CPU tensor storages" in done.stderr
    lines = {r.line: r for r in read_lines(folder(tmp_path) / "lines.csv") if r.function == "<module>"}
    allocate, call, free = lines[10], lines[11], lines[12]
    assert (allocate.memory, allocate.increment, allocate.peak, allocate.peak_exact) == (
        4 * MIB,
        4 * MIB,
        4 * MIB,
        True,
    )
    assert (call.memory, call.increment, call.peak, call.peak_exact, call.rise) == (
        4 * MIB,
        0,
        12 * MIB,
        True,
        8 * MIB,
    )
    assert (free.memory, free.increment, free.rise) == (0, -4 * MIB, 0)
    meta = read_meta(folder(tmp_path) / "meta.json")
    assert meta.memory_source == "CPU tensor storages" and meta.peak == 12 * MIB
    assert "peaks are exact" in (folder(tmp_path) / "report.txt").read_text()


@pytest.mark.slow
def test_the_memory_at_the_end_counts_the_scripts_globals_as_python_keeps_them(tmp_path):
    script = write(tmp_path / "globals.py", "import torch\nkept = torch.ones(2**18)\n")
    done = run(tmp_path, "--memory", "tensors", str(script))
    assert done.returncode == 0, done.stderr
    assert read_meta(folder(tmp_path) / "meta.json").end_memory == MIB


@pytest.mark.slow
def test_fsdp2_resharding_is_followed_like_the_census(tmp_path):
    """FSDP2 (one rank, gloo) frees its unsharded parameters with ``storage.resize_(0)``:
    the live bytes at the end match a census taken there, not census + the unsharded model."""
    script = write(
        tmp_path / "fsdp2.py",
        """
        import os, sys
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.distributed.fsdp import fully_shard
        from gpu_mem_track import MemTracker

        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[1]
        dist.init_process_group("gloo", rank=0, world_size=1)
        model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.Adam(model.parameters())
        for _ in range(2):
            model(torch.randn(8, 512)).sum().backward()
            opt.step()
            opt.zero_grad()
        census = MemTracker(out_dir=None, device="cpu", verbosity=0, probe=False).track()
        print("census", census.ledger.tensors)
        """,
    )
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    done = run(tmp_path, "--memory", "tensors", str(script), port, timeout=300)
    assert done.returncode == 0, done.stderr
    census = int(done.stdout.split("census ")[1].split()[0])
    meta = read_meta(folder(tmp_path) / "meta.json")
    model_bytes = 4 * (512 * 512 + 512) * 4
    assert census >= 3 * model_bytes  # the shards (here whole) and Adam's two states
    assert abs(meta.end_memory - census) < model_bytes // 8, (meta.end_memory, census)
