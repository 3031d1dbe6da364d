"""scripts/gpu/gpu_check_edge.py: the fraction that gives a real GPU's allocator exactly
the simulated capacity, the markdown of a hand-built record, and the dry mode end to end
(a script whose batch takes 100 MiB per sample on a simulated 2 GiB GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "gpu_check_edge.py"
MIB = 2**20

GROW = """
import sys
import torch

batch = int(sys.argv[1])
x = torch.empty(batch * 100 * 2**20, dtype=torch.uint8, device="cuda")
print("ran", batch)
"""


def _edge():
    if "gpu_check_edge" in sys.modules:
        return sys.modules["gpu_check_edge"]
    spec = importlib.util.spec_from_file_location("gpu_check_edge", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check_edge"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("allowed", "total"),
    [
        (12 * 2**30 - 500 * MIB, 150_109_880_320),  # 12GiB:sm90's capacity on an H200
        (24 * 2**30 - 676 * MIB, 85_028_896_768),  # on an H100
        (1, 3),
        (2**40 // 3, 2**40),
    ],
)
def test_fraction_gives_the_allocator_exactly_the_capacity(allowed: int, total: int) -> None:
    fraction = _edge().fraction_for(allowed, total)
    assert int(fraction * total) == allowed  # setMemoryFraction's truncation
    assert int(__import__("math").nextafter(fraction, 0.0) * total) < allowed  # the smallest such fraction


def test_fraction_of_the_whole_gpu_is_one() -> None:
    edge = _edge()
    assert edge.fraction_for(2**30, 2**30) == 1.0 and edge.fraction_for(2**31, 2**30) == 1.0
    with pytest.raises(ValueError):
        edge.fraction_for(0, 2**30)


def test_markdown_of_a_record_with_a_wrong_claim() -> None:
    real = {"ran": True, "out_of_memory": False, "message": "", "device": "GPU X"}
    real.update(max_memory_allocated=1500 * MIB, max_memory_reserved=1600 * MIB)
    real.update(fraction=0.25, total_memory=8192 * MIB, allowed=2048 * MIB)
    simulated = {"out_of_memory": True, "peak": 0, "reserved_peak": 0, "message": "CUDA out of memory."}
    row = {"batch": 17, "claim": "runs out", "agrees": False, "real": real, "simulated": simulated}
    record = {"script": "/s/train.py", "args": ["17"], "gpu": "2GiB:sm80", "batch_arg": "0", "dry": False}
    record.update(simulated_total_memory=2048 * MIB, simulated_non_pytorch=400 * MIB)
    record.update(allocator_capacity=1648 * MIB, batch=16, rows=[row])
    text = _edge().render(record)
    assert "| 17 | runs out | yes | 0.0 | 0.0 | yes | 1,500.0 | 1,600.0 | **no** |" in text
    assert "- batch 17, simulated: CUDA out of memory." in text
    assert "- batch 17: fraction 0.25 of 8,192.0 MiB (GPU X): 2,147,483,648 B allowed" in text
    assert "gives its allocator 1,648.0 MiB: 2,048.0 MiB less 400.0 MiB" in text


@pytest.mark.slow
def test_dry_mode_end_to_end(tmp_path: Path) -> None:
    """The command line with the batch given (fit's answer for this script is 16: 16 x 100
    MiB fits in the 1648 MiB the 2 GiB GPU's allocator gets, 17 x 100 MiB does not)."""
    script = tmp_path / "grow.py"
    script.write_text(GROW)
    out = tmp_path / "edge" / "edge.json"
    argv = [sys.executable, str(SCRIPT), "--gpu", "2GiB:sm80", "--batch-arg", "0", "--batch", "16"]
    done = subprocess.run(
        [*argv, "--out", str(out), "--dry", str(script), "--", "4"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert (record["batch"], record["allocator_capacity"], record["dry"]) == (16, 1648 * MIB, True)
    fits, runs_out = record["rows"]
    assert (fits["batch"], fits["claim"], fits["simulated"]["out_of_memory"]) == (16, "fits", False)
    assert fits["simulated"]["peak"] == 1600 * MIB and "real" not in fits
    assert (runs_out["batch"], runs_out["simulated"]["out_of_memory"]) == (17, True)
    assert "Tried to allocate 1.66 GiB" in runs_out["simulated"]["message"]
    assert "| 16 | fits | no | 1,600.0 |" in out.with_suffix(".md").read_text()


def test_usage_mistakes_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "grow.py"
    script.write_text(GROW)
    base = [sys.executable, str(SCRIPT), "--batch-arg", "0", "--out", str(tmp_path / "e.json"), "--dry"]
    for extra, message in (
        (["--gpu", "2GiB:sm80", str(tmp_path / "missing.py")], "no script"),
        (["--gpu", "2GiB:sm80", "--batch", "0", str(script)], "at least 1"),
        (["--gpu", "nonsense", "--batch", "3", str(script)], "unknown GPU"),
    ):
        done = subprocess.run([*base, *extra], capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "ran"), [(16, True), (17, False)])
def test_the_capped_wrapper_on_a_simulated_h200(tmp_path: Path, batch: int, ran: bool) -> None:
    """The real side's wrapper (``CAPPED``), run on a simulated H200 instead of a GPU: the
    fraction it sets gives the allocator exactly 1648 MiB (the 2 GiB GPU's capacity), so
    16 x 100 MiB runs and 17 x 100 MiB runs out with torch's message, "allowed" in it."""
    edge = _edge()
    script, wrapper, figures = tmp_path / "grow.py", tmp_path / "capped.py", tmp_path / "got.json"
    script.write_text(GROW)
    wrapper.write_text(edge.CAPPED)
    argv = [sys.executable, "-m", "gpu_mem_track", "run", "--simulate", "H200"]
    argv += ["--out-dir", str(tmp_path / "r"), str(wrapper), str(figures), str(1648 * MIB)]
    argv += [str(script), str(batch)]
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    got = json.loads(figures.read_text())
    assert got["allowed"] == 1648 * MIB and got["total_memory"] == 150_109_880_320
    assert (got["exit_code"] == 0, got["out_of_memory"]) == (ran, not ran)
    if ran:
        assert got["max_memory_allocated"] == 1600 * MIB and got["num_ooms"] == 0
    else:
        assert "1.61 GiB allowed; " in got["message"] and got["num_ooms"] == 1
