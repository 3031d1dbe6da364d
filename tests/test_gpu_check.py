"""scripts/gpu/gpu_check.py: what it reads from runs, which catalog GPU it simulates, and its dry
mode end to end (a subprocess, on the convnet example only)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "gpu"


def _load(name: str):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_iteration_times_are_read_as_nanogpt_prints_them():
    report = _load("gpu_check_report")
    output = (
        "step 0: train loss 4.2, val loss 4.2\n"
        "iter 0: loss 4.2087, time 1199.43ms, mfu -100.00%\n"
        "iter 1: loss 4.1000, time 14.20ms, mfu -100.00%\n"
        "noise iter 9: loss 1, time 5ms\n"
        "iter 2: loss nan, time 13.5 ms\n"
    )
    assert report.iteration_times(output) == [1199.43, 14.2, 13.5]
    assert report.median_after_warmup([100.0, 5.0, 3.0, 4.0], 1) == 4.0
    assert report.median_after_warmup([100.0, 5.0, 3.0], 1) is None


def test_pytest_summary_is_its_closing_line():
    report = _load("gpu_check_report")
    end = "==== 10 failed, 991 passed, 13 skipped in 147.67s (0:02:27) ====\n"
    text = "....F\nFAILED tests/test_a.py::test_b - x\n" + end
    assert report.pytest_summary(text) == "10 failed, 991 passed, 13 skipped in 147.67s (0:02:27)"
    assert report.pytest_summary("nothing ran\n") == ""


def test_memory_table_gives_differences_from_the_real_run():
    report = _load("gpu_check_report")
    rows = report.memory_rows(
        {
            "char": {
                "real": {"max_memory_allocated": 100 * 2**20, "max_memory_reserved": 200 * 2**20},
                "runner": {"peak": 100 * 2**20},
                "simulated": {"peak": 105 * 2**20, "reserved_peak": 190 * 2**20},
            },
            "gpt2": {"notes": ["plain run timed out after 60 s"]},
        }
    )
    table = report.render_memory_table(rows).splitlines()
    assert table[2] == "| char | 100.0 | 200.0 | - | 100.0 | +0.0% | 105.0 | +5.0% | 190.0 | -5.0% |  |"
    assert table[3] == "| gpt2 | - | - | - | - | - | - | - | - | - | plain run timed out after 60 s |"


@pytest.mark.parametrize(
    ("name", "total", "capability", "expected"),
    [
        ("NVIDIA H200", 150_109_880_320, [9, 0], "H200"),
        ("NVIDIA H100 80GB HBM3", 85_017_755_648, [9, 0], "H100-80GB"),
        ("NVIDIA H100 PCIe", 85_029_027_840, [9, 0], "H100-80GB"),
        ("NVIDIA A100-SXM4-80GB", 84_987_740_160, [8, 0], "A100-80GB"),
        ("NVIDIA GeForce RTX 4090", 25_756_696_576, [8, 9], "RTX-4090"),
        # The 94 GB H100 NVL is in no catalog entry: its own size and architecture.
        ("NVIDIA H100 NVL", 99_857_989_632, [9, 0], "95232MiB:sm90"),
    ],
)
def test_the_gpu_maps_to_the_catalog_by_name_and_memory(name, total, capability, expected):
    gpu_check = _load("gpu_check")
    assert gpu_check.catalog_gpu(name, total, capability) == expected


@pytest.mark.slow
def test_dry_mode_runs_the_simulated_parts_and_exits_0(tmp_path):
    out = tmp_path / "out"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_check.py"), "--dry", "--only", "convnet", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DRY MODE (--dry given)" in done.stdout
    assert "tests (dry mode)" in done.stdout and "timing (dry mode)" in done.stdout
    data = json.loads((out / "report.json").read_text())
    assert data["dry"] == "--dry given" and data["simulated_gpu"] == "H100-80GB"
    [row] = data["memory"]
    assert row["workload"] == "convnet" and row["real_allocated"] is None
    # The convnet at batch 256 on the simulated H100: weights, Adam state and activations, MiBs of them.
    assert 16 * 2**20 < row["simulated_peak"] <= row["simulated_reserved"] < 2**30, row
    assert data["failed"] == [], data["failed"]
    report = (out / "report.md").read_text()
    assert "| convnet | - | - | - | - | - |" in report
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", "runs.log"]


@pytest.mark.slow
def test_the_plain_wrapper_keeps_the_scripts_exit_code_and_argv(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(sys.argv[1:], __name__)\nsys.exit(3)\n")
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_check_wrap.py"), str(figures), "-", str(script), "a", "--b"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "['a', '--b'] __main__\n"
    data = json.loads(figures.read_text())
    # The script never started CUDA, so no allocator figures, on any machine.
    assert data["exit_code"] == 3 and data["cuda"] is False and "max_memory_allocated" not in data
