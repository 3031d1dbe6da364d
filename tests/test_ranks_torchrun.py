"""Two CPU ranks with gloo under torchrun, end to end: a DDP and an FSDP2 ``fully_shard``
+ Adam script, each run through ``python -m gpu_mem_track run``."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_mem_track.runfolder.files import read_meta

ROOT = Path(__file__).resolve().parents[1]

DDP = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from gpu_mem_track import MemTracker

dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)))
optimizer = torch.optim.Adam(model.parameters())
tracker = MemTracker(device="cpu", probe=False)
for step in range(2):
    loss = model(torch.randn(8 * (dist.get_rank() + 1), 32)).sum()
    tracker.track("forward")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
sys.stdout.write(f"rank {dist.get_rank()} done\\n")  # one write: the ranks share the pipe
dist.destroy_process_group()
"""

FSDP = """
import sys
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 4))
for layer in model:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.Adam(model.parameters())
for step in range(2):
    model(torch.randn(8, 32)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
sys.stdout.write(f"rank {dist.get_rank()} done\\n")  # one write: the ranks share the pipe
dist.destroy_process_group()
"""


CRASH = """
import time
import torch.distributed as dist

dist.init_process_group("gloo")
data = bytearray(1 << 20)
if dist.get_rank() == 1:
    raise RuntimeError("rank 1 fails")
for _ in range(1200):  # rank 0 waits until torchrun stops it (SIGTERM)
    time.sleep(0.05)
"""


def torchrun(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    # CPU ranks on any machine: on a GPU one, the default device is each rank's own GPU,
    # which these gloo scripts never use (peak 0), and a rank may have none (cuda:1 of one).
    command += ["-m", "gpu_mem_track", "run", "--device", "cpu", "--out-dir", str(tmp_path / "reports")]
    command.append(str(script))
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def check_launch(tmp_path: Path, done: subprocess.CompletedProcess[str]) -> Path:
    assert done.returncode == 0, done.stderr[-3000:]
    (launch,) = (tmp_path / "reports").iterdir()
    assert re.fullmatch(r"train-[0-9a-f]{8}", launch.name)  # --standalone: a UUID rendezvous id
    assert sorted(p.name for p in launch.iterdir() if p.is_dir()) == ["rank0", "rank1"]
    for rank in (0, 1):
        meta = read_meta(launch / f"rank{rank}" / "meta.json")
        assert (meta.rank, meta.world_size, meta.exit_code, meta.launch) == (rank, 2, 0, launch.name)
    with (launch / "ranks.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["rank"], row["status"]) for row in rows] == [("0", "ok"), ("1", "ok")]
    assert all(int(row["peak"]) > 0 for row in rows)
    # Only rank 0 prints our summary and the table; both ranks print the script's output.
    assert done.stderr.count("gpu_mem_track: train.py exited with 0") == 1
    assert "rank 0 of 2" in done.stderr and "rank 1 of 2" not in done.stderr
    assert "Ranks of" in done.stderr and "Spread: largest peak / smallest" in done.stderr
    assert sorted(done.stdout.split("\n")).count("rank 1 done") == 1
    return launch


@pytest.mark.slow
def test_ddp_on_two_cpu_ranks(tmp_path):
    launch = check_launch(tmp_path, torchrun(tmp_path, DDP))
    with (launch / "rank1" / "tracker.csv").open(newline="") as handle:
        assert {row["rank"] for row in csv.DictReader(handle)} == {"1"}
    assert "forward" in (launch / "rank1" / "tracker.log").read_text()


@pytest.mark.slow
def test_fsdp2_with_adam_on_two_cpu_ranks(tmp_path):
    check_launch(tmp_path, torchrun(tmp_path, FSDP))


@pytest.mark.slow
def test_a_failing_rank_is_marked_and_the_stopped_one_keeps_whole_reports(tmp_path):
    done = torchrun(tmp_path, CRASH)
    assert done.returncode != 0
    (launch,) = (tmp_path / "reports").iterdir()
    for rank, code in ((0, 143), (1, 1)):
        meta = read_meta(launch / f"rank{rank}" / "meta.json")
        assert meta.exit_code == code and meta.ended is not None
        assert (launch / f"rank{rank}" / "lines.csv").is_file()
        assert (launch / f"rank{rank}" / "report.txt").is_file()
    with (launch / "ranks.csv").open(newline="") as handle:
        assert [row["status"] for row in csv.DictReader(handle)] == ["exit 143", "exit 1"]
