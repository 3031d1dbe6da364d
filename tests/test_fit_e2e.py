"""``gpu-mem-track fit`` end to end: real simulated trials (``run --simulate --lever``)
of a small plain-torch script on a 2 GiB simulated GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=12)
batch = parser.parse_args().batch_size


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)
        self.down = torch.nn.Linear(1024, 256)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(8))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


model = Model().cuda()
optimizer = torch.optim.AdamW(model.parameters())
for step in range(20):
    x = torch.randn(batch, 2048, 256, device="cuda")
    loss = model(x).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

GPU = "2GiB:sm80"


def gmt(*argv: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *argv], capture_output=True, text=True, cwd=cwd, timeout=900
    )


def simulated(cwd, name: str, *argv: str) -> dict:
    """``meta.json`` of a plain ``run --simulate`` of the script."""
    gmt("run", "--simulate", GPU, "--out-dir", "direct", "--run-name", name, *argv, cwd=cwd)
    return json.loads((cwd / "direct" / name / "meta.json").read_text())


@pytest.mark.slow
def test_checkpoint_makes_it_fit_and_the_batch_found_is_the_largest(tmp_path):
    from gpu_mem_track.advisor.records import FitResult
    from gpu_mem_track.advisor.render import render_fit

    (tmp_path / "train.py").write_text(SCRIPT)
    argv = ("--levers=checkpoint", "--batch-arg=--batch_size", "--json", "--html=fit.html", "--jobs=2", GPU)
    done = gmt("fit", *argv, "train.py", "--batch_size=16", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = {row["label"]: row for row in result["rows"]}
    assert list(rows) == ["as it is", "checkpoint"]
    assert rows["as it is"]["fits"] == "no" and rows["as it is"]["at_least"]
    assert rows["checkpoint"]["fits"] == "yes"
    assert result["verdict"] == "found" and result["recommended"] == "checkpoint"
    assert (
        rows["checkpoint"]["change"] == "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"
    )
    assert "trial checkpoint: started" in done.stderr  # progress on stderr, JSON alone on stdout
    # every figure is a trial's: the checkpoint row is its run folder's meta.json
    meta = json.loads((tmp_path / rows["checkpoint"]["folder"] / "meta.json").read_text())
    assert (meta["peak"], meta["reserved_peak"]) == (
        rows["checkpoint"]["peak"],
        rows["checkpoint"]["reserved_peak"],
    )
    # the largest batch with checkpoint: a direct run confirms it, and the next batch does not fit
    best = rows["checkpoint"]["batch"]["batch"]
    assert best > 16
    at = simulated(tmp_path, "at", "--lever", "checkpoint", "train.py", f"--batch_size={best}")
    above = simulated(tmp_path, "above", "--lever", "checkpoint", "train.py", f"--batch_size={best + 1}")
    assert at["exit_code"] == 0 and at["simulation"]["out_of_memory"] is None
    assert at["reserved_peak"] == rows["checkpoint"]["batch"]["reserved_peak"]
    assert above["simulation"]["out_of_memory"] is not None
    # as it is, the largest batch is below the user's 16, and the next one runs out
    plain = rows["as it is"]["batch"]["batch"]
    assert 1 <= plain < 16
    assert simulated(tmp_path, "plain", "train.py", f"--batch_size={plain + 1}")["simulation"][
        "out_of_memory"
    ]
    # the table says so
    lines = render_fit(FitResult.from_dict(result)).splitlines()
    assert lines[0].startswith("What would fit: train.py on simulated 2GiB:sm80: capacity 1.61 GiB")
    assert lines[2].split()[:3] == ["as", "it", "is"] and " no " in lines[2] and "short >= " in lines[2]
    assert lines[3].split()[0] == "checkpoint" and " yes " in lines[3] and f" {best} " in lines[3]
    assert lines[4].startswith("Recommended: checkpoint (cheapest change that fits): ")
    assert lines[5] == f"With checkpoint, batch {best} fits (--batch_size; you run 16)."
    assert "Recommended: checkpoint" in (tmp_path / "fit.html").read_text()
