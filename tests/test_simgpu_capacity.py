"""Capacity from measurements (simgpu/catalog.py): the H200's and H100's total memory and
non-PyTorch memory as measured, a saved probe result taking precedence at every entry
point of the simulated GPU (catalog.parse_gpu, probecache.py, tracker/probe.py), and
out of memory where the GPU's would be: the reserved bytes plus the non-PyTorch memory past the total, or past
``set_per_process_memory_fraction``, with PyTorch's message
(c10/cuda/CUDACachingAllocator.cpp: "Including non-PyTorch memory, this process has ...
memory in use. ... allowed; Of the allocated memory ...")."""

from __future__ import annotations

import json

import pytest
import torch

from gpu_mem_track.probecache import SAVED_SOURCE
from gpu_mem_track.runfolder.records import RunInfo, SimulationInfo
from gpu_mem_track.runfolder.simtext import simulation_lines
from gpu_mem_track.simgpu import GPUS, parse_gpu, simulated_gpu
from gpu_mem_track.simgpu.catalog import with_saved_probe
from gpu_mem_track.simgpu.engine import format_size
from gpu_mem_track.simgpu.table import gpus_dict, render_gpus
from gpu_mem_track.tracker.probe import saved_probe
from gpu_mem_track.tracker.records import ProbeResult, ProbeStage

MiB = 2**20
H200_TOTAL = 150_109_880_320  # fixtures/h200/README.md, torch's total_memory there


def test_the_h200_and_h100_carry_the_measured_figures_with_their_sources():
    h200, h100, a100 = GPUS["h200"], GPUS["h100-80gb"], GPUS["a100-40gb"]
    assert h200.total_memory == H200_TOTAL and "measured" in h200.source
    for spec in (h200, h100):  # fixtures/h200/logs/probe.log: 518 MiB, +158 MiB, +8 MiB
        assert (spec.context_bytes, spec.library_bytes) == (518 * MiB, 166 * MiB)
        assert spec.non_pytorch_bytes == 684 * MiB
        assert spec.context_source.startswith("measured by gpu-mem-track probe on an H200")
    assert h200.capacity == H200_TOTAL - 684 * MiB
    assert "same Hopper architecture" in h100.context_source
    assert a100.library_bytes == 0 and a100.context_source.startswith("assumed")
    assert all(spec.context_source for spec in GPUS.values())
    assert type(h200).from_dict(h200.to_dict()) == h200


def _fill_to(capacity_left: int) -> torch.Tensor:
    """One block that leaves ``capacity_left`` bytes of the capacity (a multiple of 2 MiB)."""
    return torch.empty(torch.cuda.mem_get_info()[0] - capacity_left, dtype=torch.uint8, device="cuda")


def test_out_of_memory_comes_where_reserved_plus_non_pytorch_memory_pass_the_total():
    with simulated_gpu("h200") as gpu:
        free, total = torch.cuda.mem_get_info()
        assert total == H200_TOTAL and free == H200_TOTAL - 684 * MiB
        # requests of 10 MiB and more take a segment of their own size (rounded to 2 MiB)
        left = free % (2 * MiB) + 10 * MiB  # the last 10 MiB that fit, and the bytes under 2 MiB
        keep = _fill_to(left)
        last = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")  # exactly fits
        reserved = torch.cuda.memory_reserved()
        assert reserved + gpu.spec.non_pytorch_bytes <= H200_TOTAL < reserved + 684 * MiB + 10 * MiB
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        del keep, last
    free_then, in_use = format_size(H200_TOTAL - 684 * MiB - reserved), format_size(reserved + 684 * MiB)
    assert str(caught.value).startswith(
        "CUDA out of memory. Tried to allocate 10.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which "
        f"{free_then} is free. Including non-PyTorch memory, this process has {in_use} memory in use. "
        f"Of the allocated memory {format_size(reserved)} is allocated by PyTorch, and 0 bytes is reserved "
        "by PyTorch but unallocated."
    )
    assert gpu.out_of_memory.capacity == H200_TOTAL - 684 * MiB


def test_a_memory_fraction_counts_reserved_bytes_only_and_says_what_is_allowed():
    with simulated_gpu("h200") as gpu:
        torch.cuda.set_per_process_memory_fraction(0.5)
        allowed = int(0.5 * H200_TOTAL)  # fraction * total, as PyTorch computes it
        fits = allowed // (2 * MiB) * (2 * MiB)
        keep = torch.empty(fits, dtype=torch.uint8, device="cuda")  # up to the limit: no error
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
        reserved = torch.cuda.memory_reserved()
        del keep
    assert reserved == fits
    message = str(caught.value)
    assert f"this process has {format_size(fits + 684 * MiB)} memory in use. " in message
    assert f"in use. {format_size(allowed)} allowed; Of the allocated memory {format_size(fits)}" in message
    assert gpu.out_of_memory.request == 10 * MiB
    # the report's "of <capacity>" is the limit that refused it, not the GPU's capacity
    assert gpu.out_of_memory.capacity == allowed < gpu.spec.capacity


def _save_probe(folder, name: str, gpu_name: str, context_mib: int, cublas_mib: int) -> None:
    stages = (
        ProbeStage("before CUDA", 0, 0),
        ProbeStage("CUDA context", (context_mib + 2) * MiB, 2 * MiB),
        ProbeStage("first cuBLAS matmul", (context_mib + cublas_mib + 34) * MiB, 34 * MiB),
        ProbeStage("first cuDNN convolution", (context_mib + cublas_mib + 40) * MiB, 34 * MiB),
    )
    result = ProbeResult("cuda:0", gpu_name, "nvml process", "2.13.0+cu130", stages, uuid="GPU-x")
    (folder / f"probe-{name}.json").write_text(json.dumps(result.to_dict()))


def test_a_saved_probe_result_takes_precedence_for_its_gpu(tmp_path):
    _save_probe(tmp_path, "a", "NVIDIA H200", 530, 150)
    _save_probe(tmp_path, "b", "NVIDIA A100-SXM4-40GB", 420, 60)
    (tmp_path / "probe-broken.json").write_text("{not json")
    result, path = saved_probe("NVIDIA H200", tmp_path)
    assert result.context == 530 * MiB and path.name == "probe-a.json"
    h200 = with_saved_probe(GPUS["h200"], tmp_path)
    assert (h200.context_bytes, h200.library_bytes) == (530 * MiB, 156 * MiB)  # cuBLAS 150 + cuDNN 6
    assert h200.capacity == H200_TOTAL - 686 * MiB
    assert h200.context_source.startswith("measured by gpu-mem-track probe on this machine's NVIDIA H200")
    a100 = with_saved_probe(GPUS["a100-40gb"], tmp_path)
    assert (a100.context_bytes, a100.library_bytes) == (420 * MiB, 66 * MiB)
    assert with_saved_probe(GPUS["t4"], tmp_path) == GPUS["t4"]  # no result for it: the catalog's
    assert saved_probe("NVIDIA H200", tmp_path / "missing") is None


@pytest.fixture
def saved_h200(tmp_path, monkeypatch):
    """A probe result for the H200 (context 530 MiB, cuBLAS/cuDNN 156 MiB) saved in a
    temporary cache folder, with saved results turned on (the suite turns them off)."""
    _save_probe(tmp_path, "a", "NVIDIA H200", 530, 150)
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))
    monkeypatch.setenv("GPU_MEM_TRACK_SAVED_PROBE", "on")
    return H200_TOTAL - 686 * MiB


def test_every_entry_point_of_the_simulated_gpu_counts_the_saved_probe(saved_h200):
    from gpu_mem_track.estimator.batchsize import _budget
    from gpu_mem_track.estimator.options import StepOptions
    from gpu_mem_track.estimator.target import target_spec
    from gpu_mem_track.runner.options import RunOptions
    from gpu_mem_track.runner.simulate import check_simulate

    assert parse_gpu("h200").capacity == saved_h200
    assert parse_gpu("H200").context_source.endswith("probe-a.json)")
    with simulated_gpu("h200") as gpu:  # the API
        assert gpu.spec.capacity == saved_h200
        assert torch.cuda.mem_get_info()[0] == saved_h200
    assert check_simulate(RunOptions(script="t.py", simulate="h200"), None).capacity == saved_h200
    assert target_spec("h200").capacity == saved_h200  # estimate --gpu
    budget, source = _budget(None, StepOptions(gpu="h200"), measured=False)  # batch-size --gpu
    assert budget == saved_h200
    assert source.startswith(
        "simulated: H200's capacity: total memory 139.80 GiB less 686.00 MiB of non-PyTorch"
    )
    assert "measured by gpu-mem-track probe on this machine's NVIDIA H200 (torch 2.13.0+cu130;" in source
    # a GpuSpec given is used as is; the custom SIZE:smXY names no GPU a probe ran on
    assert parse_gpu(GPUS["h200"]) is GPUS["h200"]
    assert parse_gpu("24GiB:sm90").context_source.startswith("assumed")


def test_the_notebook_magic_counts_the_saved_probe(saved_h200):
    pytest.importorskip("IPython")
    from gpu_mem_track.notebook.magics import parse_cell_options

    assert parse_cell_options("--simulate h200").simulate.capacity == saved_h200  # %%memtrack


def test_the_saved_probe_can_be_turned_off(saved_h200, monkeypatch):
    assert parse_gpu("h200", saved_probe=False) is GPUS["h200"]
    monkeypatch.setenv("GPU_MEM_TRACK_SAVED_PROBE", "off")
    assert parse_gpu("h200") is GPUS["h200"]
    assert parse_gpu("h200", saved_probe=True).capacity == saved_h200
    with simulated_gpu("h200") as gpu:
        assert gpu.spec.capacity == H200_TOTAL - 684 * MiB


def test_a_step_that_does_not_fit_says_which_capacity(saved_h200):
    from gpu_mem_track.estimator.target import _does_not_fit
    from gpu_mem_track.simgpu.records import OutOfMemory

    spec = parse_gpu("h200")
    record = OutOfMemory("t.py", 3, 2 * MiB, MiB, MiB, spec.capacity, "out of memory")
    text = str(_does_not_fit(spec, record, True))
    assert "(H200's capacity: total memory 139.80 GiB less 686.00 MiB of non-PyTorch memory" in text
    assert "measured by gpu-mem-track probe on this machine's NVIDIA H200" in text


def test_the_report_and_the_gpus_table_say_what_is_counted_outside_pytorch():
    def line(spec):
        info = RunInfo("r", "t.py", (), "cuda:0", "cuda allocator", "sys.settrace", 0.0, "3", "", "0")
        sim = SimulationInfo(gpu=spec.to_dict())
        return simulation_lines(type(info)(**{**info.__dict__, "simulation": sim}))[0]

    assert line(GPUS["h200"]).startswith(
        "Simulated GPU: H200, 139.80 GiB (non-PyTorch memory 684.00 MiB measured: CUDA context 518.00 MiB, "
        "cuBLAS/cuDNN 166.00 MiB), compute capability 9.0"
    )
    assert "(non-PyTorch memory 300.00 MiB assumed)" in line(GPUS["t4"])
    # a saved probe's figures say so, and how to ignore them (the catalog's are the H200's too)
    saved = GPUS["h200"].measured(
        600 * MiB, 206 * MiB, f"{SAVED_SOURCE} NVIDIA H200 (torch 2.11; probe-h200.json)"
    )
    assert "(non-PyTorch memory 806.00 MiB measured by this machine's saved probe, " in line(saved)
    assert "GPU_MEM_TRACK_SAVED_PROBE=off ignores it: CUDA context 600.00 MiB" in line(saved)
    assert "saved probe" not in line(GPUS["h200"])
    table = render_gpus(list(GPUS.values()))
    h200_row = next(row for row in table.splitlines() if row.startswith("H200 "))
    assert "518.00 MiB" in h200_row and "166.00 MiB" in h200_row and "139.13 GiB" in h200_row
    assert "  H200: measured by gpu-mem-track probe on an H200" in table
    h200 = next(g for g in gpus_dict(GPUS.values())["gpus"] if g["name"] == "H200")
    assert h200["non_pytorch_bytes"] == 684 * MiB and h200["capacity"] == H200_TOTAL - 684 * MiB


@pytest.mark.slow
def test_run_simulate_counts_the_probe_saved_for_that_gpu(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from gpu_mem_track.runfolder.files import read_meta

    cache = tmp_path / "cache"
    cache.mkdir()
    _save_probe(cache, "h200", "NVIDIA H200", 600, 200)
    (tmp_path / "s.py").write_text(
        "import torch\nprint(torch.cuda.mem_get_info()[0])\nx = torch.empty(2**30, device='cuda')\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", "run", "--run-name", "r", "--simulate", "h200", "s.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(root),
            "GPU_MEM_TRACK_CACHE": str(cache),
            "GPU_MEM_TRACK_SAVED_PROBE": "on",  # the suite turns saved results off
        },
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(H200_TOTAL - 806 * MiB)  # 600 + 200 + 6 (cuDNN) MiB outside
    gpu = read_meta(tmp_path / "reports" / "r" / "meta.json").simulation.gpu
    assert (gpu["context_bytes"], gpu["library_bytes"]) == (600 * MiB, 206 * MiB)
    assert str(cache / "probe-h200.json") in gpu["context_source"]
    assert "non-PyTorch memory 806.00 MiB measured" in done.stderr
