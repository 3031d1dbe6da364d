"""``fit --nproc-per-node`` end to end: a script written for one GPU, each trial's ranks
simulated in child processes; the answer names FSDP2, the world sizes tried and the
lines to write. Slow (about 8 trials of 2 ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The model (a ModuleList of blocks), also the DDP script's of test_fit_distributed_combined.
MODEL = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, d=1024, n=6):
        super().__init__()
        self.h = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x
"""

SCRIPT = (
    MODEL
    + """

model = Net().to("cuda")
optimizer = torch.optim.AdamW(model.parameters())
for step in range(3):
    model(torch.randn(32, 1024, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""
)


def test_a_single_gpu_script_gets_fsdp2_over_the_ranks_asked(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).lstrip())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    command = [sys.executable, "-m", "gpu_mem_track", "fit", "--nproc-per-node", "4", "--json"]
    command += ["--out-dir", str(tmp_path / "reports"), "1400MiB:sm80", str(script)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = {(r["row"]["label"], r["world"]): r["row"] for r in result["rows"]}
    assert rows[("as it is", 4)]["fits"] in ("no", "tight")
    assert rows[("fsdp2", 4)]["fits"] == "yes"
    assert rows[("fsdp2", 4)]["reserved_peak"] < rows[("as it is", 4)]["reserved_peak"]
    assert dict(result["not_applied"])["zero"].startswith("the optimizer is built outside a process group")
    assert result["answer"].startswith("fits on 4 x 1400MiB:sm80 with fsdp2")
    assert result["launch"][0] == f"torchrun --nproc-per-node 4 {script}"
    assert any("DistributedSampler" in line for line in result["launch"])
    assert "dist.init_process_group('nccl')" not in result["launch"]  # once, with the device's line
    assert sum("dist.init_process_group('nccl')" in line for line in result["launch"]) == 1
    assert all(Path(r["row"]["folder"]).name in ("rank0", "rank3", "rank1") for r in result["rows"])
