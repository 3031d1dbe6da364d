"""``gpu-mem-track fit`` end to end: real simulated trials (``run --simulate --lever``)
of a small plain-torch script on a 2 GiB simulated GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_mem_track.advisor.records import FitResult
from gpu_mem_track.advisor.render import render_fit

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
    # the answer first, then the table, best first
    lines = render_fit(FitResult.from_dict(result)).splitlines()
    assert lines[0].startswith("What would fit: train.py on simulated 2GiB:sm80: capacity 1.61 GiB")
    assert lines[1].startswith("Recommended: checkpoint (cheapest change that fits): ")
    assert lines[2] == f"With checkpoint, batch {best} fits (--batch_size; you run 16)."
    assert lines[3].split() == [
        "change",
        "fits",
        "at",
        "16",
        "largest",
        "batch",
        "headroom",
        "at",
        "16",
        "cost",
    ]
    assert lines[4].split()[:4] == ["checkpoint", "(recommended)", "yes", str(best)]
    assert lines[5].split()[:5] == ["as", "it", "is", "no", str(plain)] and "short >= " in lines[5]
    assert "Recommended: checkpoint" in (tmp_path / "fit.html").read_text()


TRAINER = """\
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("batch", type=int)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
args = parser.parse_args()

config = LlamaConfig(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    vocab_size=4096,
    use_cache=False,
)
model = LlamaForCausalLM(config).to(torch.bfloat16)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        ids = torch.randint(0, 4096, (128,))
        return {"input_ids": ids, "labels": ids}


training = TrainingArguments(
    output_dir="trainer_out",
    per_device_train_batch_size=args.batch,
    gradient_accumulation_steps=args.gradient_accumulation_steps,
    max_steps=3,
    bf16=True,
    save_strategy="no",
    report_to=[],
    disable_tqdm=True,
)
Trainer(model=model, args=training, train_dataset=Tokens()).train()
"""


@pytest.mark.slow
def test_a_trainer_script_in_bf16_that_fits_only_a_smaller_batch(tmp_path):
    """A Hugging Face Trainer script with a Llama-style model in bf16 (a small one) whose
    batch 512 fits with nothing: exit 3, the answer leads with the change that reaches the
    largest batch and keeps the batch by the script's --gradient_accumulation_steps;
    autocast (bf16 weights) is not tried, found from its run, not from the text."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gpu_mem_track.advisor.plan import rank

    (tmp_path / "train.py").write_text(TRAINER)
    argv = (
        "--levers=expandable,autocast,checkpoint",
        "--batch-arg=0",
        "--json",
        "--html=fit.html",
        "1GiB:sm90",
    )
    done = gmt("fit", *argv, "train.py", "512", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "smaller"
    rows = {row["label"]: row for row in result["rows"]}
    assert not any("autocast" in label for label in rows)
    assert dict(result["not_applied"])["autocast"] == (
        "the model's weights are already bfloat16: autocast changes nothing"
    )
    assert all(row["fits"] == "no" for row in rows.values())
    best = min(rows.values(), key=lambda r: (-r["batch"]["batch"], rank(r["levers"])))
    assert result["recommended"] == best["label"] and 1 <= best["batch"]["batch"] < 512
    keep = result["accumulation"]
    assert keep["how"] == f"--gradient_accumulation_steps={keep['steps']}"
    assert keep["batch"] <= best["batch"]["batch"] and keep["batch"] * keep["steps"] >= 512
    # the batch found completed within the capacity in its own trial
    meta = json.loads((tmp_path / best["batch"]["folder"] / "meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["simulation"]["out_of_memory"] is None
    lines = render_fit(FitResult.from_dict(result)).splitlines()
    assert lines[1].startswith("Nothing fits at batch 512 (argument 0 after the script). Best: ")
    assert f"which fits batch {best['batch']['batch']}" in lines[1]
    assert any(
        line.startswith(f"  To keep the effective batch of 512: batch {keep['batch']} x {keep['steps']} ")
        for line in lines
    )
    assert "Not tried: autocast: the model's weights are already bfloat16" in "\n".join(lines)
    assert "<tr class='recommended'>" in (tmp_path / "fit.html").read_text()


NANOGPT = Path("/work/shared/fixtures/h200/clients/nanogpt")


@pytest.mark.slow
@pytest.mark.skipif(not (NANOGPT / "make_data.py").is_file(), reason="no nanoGPT client")
def test_nanogpt_at_a_batch_nothing_fits_keeps_it_with_its_accumulation_steps(tmp_path):
    """nanoGPT's GPT-2 (4 layers, block 512) at batch 32 on a 6 GiB simulated GPU: nothing fits at 32; the
    answer is the change that reaches the largest batch, kept by nanoGPT's own
    --gradient_accumulation_steps (40 by default: multiplied); autocast (nanoGPT
    autocasts to bf16) and the optimizer levers (fused AdamW) are not tried."""
    import shutil

    from gpu_mem_track.advisor.plan import rank

    work = tmp_path / "ng"
    shutil.copytree(NANOGPT, work)
    subprocess.run([sys.executable, "make_data.py"], cwd=work, check=True, capture_output=True, timeout=600)
    args = ("--compile=False", "--batch_size=32", "--block_size=512", "--n_layer=4")
    done = gmt("fit", "--batch-arg=--batch_size", "--json", "6GiB:sm90", "train.py", *args, cwd=work)
    result = json.loads(done.stdout or "{}")
    assert done.returncode == 3, done.stderr[-3000:]
    assert result["verdict"] == "smaller"
    rows = {row["label"]: row for row in result["rows"]}
    skipped = dict(result["not_applied"])
    assert skipped["autocast"].startswith("the script already autocasts (bfloat16)")
    assert not any("autocast" in label for label in rows)
    best = min(rows.values(), key=lambda r: (-r["batch"]["batch"], rank(r["levers"])))
    assert result["recommended"] == best["label"] and 1 <= best["batch"]["batch"] < 32
    keep = result["accumulation"]
    assert keep["how"] == f"--gradient_accumulation_steps={40 * keep['steps']} (40 x {keep['steps']})"
