"""``torchrun --nproc-per-node 2 -m gpu_mem_track fit GPU script.py``, end to end (gloo
on the CPU): rank 0 reads the world size, simulates every rank and prints the answer
``fit --nproc-per-node 2`` gives; rank 1 runs no trial, prints nothing and exits 0; no
process is left behind. Slow (torchrun, then a trial of two simulated ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DDP = """
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=16)
batch = parser.parse_args().batch_size
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else "cpu"
model = nn.parallel.DistributedDataParallel(nn.Linear(256, 256).to(device))
optimizer = torch.optim.AdamW(model.parameters())
for step in range(2):
    model(torch.randn(batch, 256, device=device)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
"""


def torchrun(tmp_path: Path, *fit_args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(DDP).lstrip())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "gpu_mem_track", "fit", "--out-dir", str(tmp_path / "reports"), *fit_args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)


def left_behind(tmp_path: Path) -> list[str]:
    """The command lines of the processes still running that name ``tmp_path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if str(tmp_path) in line:
            found.append(line)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the processes left from /proc")
def test_under_torchrun_rank_0_answers_for_the_world_and_the_other_rank_runs_nothing(tmp_path):
    done = torchrun(tmp_path, "A100-40GB", "ddp.py", "--batch_size", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ddp.py on 2 x A100-40GB (simulated; "), done.stdout
    assert sum("on 2 x A100-40GB (simulated" in line for line in lines) == 1  # one rank printed
    assert "Answer: fits on 2 x A100-40GB as it is" in lines
    assert "  torchrun --nproc-per-node 2 ddp.py --batch_size 8" in lines
    assert any(line.startswith("1 trial in ") for line in lines)
    (session,) = (tmp_path / "reports").iterdir()  # one fit: rank 1 simulated nothing
    assert sorted(p.name for p in session.iterdir() if p.is_dir()) == ["baseline-w2"]
    assert sorted(p.name for p in (session / "baseline-w2").iterdir() if p.is_dir()) == ["rank0", "rank1"]
    assert left_behind(tmp_path) == []


@pytest.mark.slow
def test_under_torchrun_a_usage_mistake_fails_the_launch_in_one_line(tmp_path):
    done = torchrun(tmp_path, "A100-40GB", "missing.py")
    assert done.returncode != 0  # torchrun's own code (1) for rank 0's 2
    assert "gpu_mem_track: missing.py: no such script" in done.stderr
    assert done.stderr.count("no such script") == 1
    assert done.stdout == ""
    assert not (tmp_path / "reports").exists()
