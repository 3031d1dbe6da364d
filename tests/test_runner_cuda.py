"""The runner on CUDA: allocator readings, exact peaks, and the program's own peak counter
left as it would be without us."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_mem_track.runner.files import read_lines, read_meta

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import torch
x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
y = torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda") + 1
del y
print("max", torch.cuda.max_memory_allocated())
"""


@pytest.mark.cuda
def test_runner_reads_the_allocator_and_leaves_the_peak_counter_alone(tmp_path):
    script = tmp_path / "cuda_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=True)
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--out-dir", str(tmp_path), "--run-name", "c"]
    done = subprocess.run([*command, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == plain.stdout.strip()  # max_memory_allocated as without us
    out = tmp_path / "c"
    meta = read_meta(out / "meta.json")
    assert (meta.memory_source, meta.device) == ("cuda allocator", "cuda:0")
    lines = {r.line: r for r in read_lines(out / "lines.csv")}
    mib = 2**20
    assert lines[3].increment == 64 * mib
    # y's line allocates two 32 MiB blocks (the empty and the sum) and frees one
    assert lines[4].increment == 32 * mib and lines[4].peak == 128 * mib and lines[4].peak_exact
    assert lines[5].increment == -32 * mib
    assert meta.peak == 128 * mib
