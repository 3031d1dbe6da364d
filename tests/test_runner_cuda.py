"""The runner on CUDA: allocator readings, exact peaks, and the program's own peak counter
left as it would be without us."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gpu_mem_track.runfolder.files import read_lines, read_meta

ROOT = Path(__file__).resolve().parents[1]
#: On a machine without a GPU the script runs on a simulated A100-40GB: the same runner,
#: CUDA sampler and snapshot code, the allocator answering from the simulation.
ON_GPU = [] if torch.cuda.is_available() else ["--simulate", "a100-40gb", "--run-to-end"]
SCRIPT = """
import torch
x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
y = torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda") + 1
del y
print("max", torch.cuda.max_memory_allocated())
"""


@pytest.mark.slow
def test_runner_reads_the_allocator_and_leaves_the_peak_counter_alone(tmp_path):
    script = tmp_path / "cuda_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--out-dir", str(tmp_path), "--run-name", "c"]
    command += ON_GPU
    done = subprocess.run([*command, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    # max_memory_allocated as without us: the script's own 128 MiB
    assert done.stdout.strip() == f"max {128 * 2**20}"
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


SNAPSHOT_SCRIPT = """
import torch
x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
def temporary():
    return (torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda") + 1).sum()
temporary()
temporary()
del x
"""


@pytest.mark.slow
def test_snapshot_run_keeps_the_snapshot_and_gives_exact_peaks_below_the_high_water_mark(tmp_path):
    script = tmp_path / "snap.py"
    script.write_text(textwrap.dedent(SNAPSHOT_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "gpu_mem_track",
        "run",
        "--snapshot",
        "--out-dir",
        str(tmp_path),
        *ON_GPU,
    ]
    done = subprocess.run(
        [*command, "--run-name", "s", str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "s"
    assert {"snapshot.pickle", "snapshot_lines.csv", "snapshot.json"} <= {p.name for p in out.iterdir()}
    from gpu_mem_track.snapshotfile import load_snapshot

    mib = 2**20
    trace = load_snapshot(out / "snapshot.pickle").device_traces[0]
    first = next(e for e in trace if e.action == "alloc")  # recorded from CUDA's start on
    where = [(f.filename, f.line) for f in first.frames]
    assert first.size == 64 * mib and (str(script.resolve()), 3) in where
    lines = {r.line: r for r in read_lines(out / "lines.csv")}
    # x and the two 32 MiB temporaries of the addition; the second call stays below the
    # high-water mark the first one set, so only the trace gives its peak exactly
    assert (lines[6].peak, lines[7].peak) == (128 * mib, 128 * mib)
    assert lines[7].peak_exact and lines[7].increment == 0
    assert lines[8].peak == 64 * mib and lines[8].peak_exact  # del x: 64 MiB before the free
    assert all(r.peak_exact for r in lines.values())
    assert "Line peaks from the trace:" in done.stderr
