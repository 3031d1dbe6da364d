"""``run --simulate --lever``: each lever applies to an unmodified script, and its saving
is the one the script edited by hand gives (the report's own ``change`` written at its
``where``): the same peak allocated and reserved bytes. Then the levers that cannot
apply, and why, and that nothing is left patched after a run."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

from gpu_mem_track.levers import LeverReport, read_levers
from gpu_mem_track.runfolder.files import read_meta
from gpu_mem_track.runfolder.records import RunInfo

GPU = "2GiB:sm80"

#: A residual network of four blocks (a script's class definitions; the distributed
#: levers' tests build their scripts on it too).
NET = """

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, d=256, n=4):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.h = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.embed(x)
        for block in self.h:
            x = block(x)
        return self.head(x)


"""

MODEL = (
    """
import torch
from torch import nn
"""
    + NET
    + "model = Net().cuda()\n"
)

TRAIN = (
    MODEL
    + """
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(4096, 256, device="cuda")
    y = torch.randint(0, 10, (4096,), device="cuda")
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
"""
)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def simulate(in_process, tmp_path: Path, script: Path, name: str, *options: str, gpu: str = GPU) -> RunInfo:
    out = tmp_path / "reports"
    done = in_process(
        "run", "--simulate", gpu, "--run-to-end", "--out-dir", out, "--run-name", name, *options, script
    )
    assert done.returncode == 0, done.stderr
    return read_meta(out / name / "meta.json")


def edited(script: Path, report: LeverReport) -> Path:
    """A copy of ``script`` with the report's change written by hand at its line."""
    file, _, line = report.where.rpartition(":")
    assert Path(file).name in (script.name, "train.py")
    lines = script.read_text().splitlines()
    old = lines[int(line) - 1]
    lines[int(line) - 1] = old[: len(old) - len(old.lstrip())] + report.change
    copy = script.with_name(f"edited_{report.name.replace('-', '_')}.py")
    copy.write_text("\n".join(lines) + "\n")
    return copy


@pytest.mark.parametrize(
    ("lever", "detail", "change"),
    [
        (
            "checkpoint",
            "4 x Block in h (12 block call(s) checkpointed)",
            "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
        ),
        ("autocast", "bfloat16", 'with torch.autocast("cuda", dtype=torch.bfloat16): out = model(x)'),
        (
            "fused",
            "1 optimizer: AdamW",
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)",
        ),
        (
            "no-foreach",
            "1 optimizer: AdamW",
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)",
        ),
        (
            "grads-to-none",
            "3 zero_grad(set_to_none=False) call(s) set gradients to None",
            "optimizer.zero_grad(set_to_none=True)",
        ),
    ],
)
def test_a_lever_saves_what_the_script_edited_by_hand_saves(in_process, tmp_path, lever, detail, change):
    script = write(tmp_path / "train.py", TRAIN)
    base = simulate(in_process, tmp_path, script, "base")
    with_lever = simulate(in_process, tmp_path, script, lever, "--lever", lever)
    [report] = read_levers(tmp_path / "reports" / lever)
    assert (report.name, report.applied, report.reason, report.detail) == (lever, True, "", detail)
    assert report.change == change
    by_hand = simulate(in_process, tmp_path, edited(script, report), f"{lever}-by-hand")
    assert by_hand.levers == ()
    assert (with_lever.peak, with_lever.reserved_peak) == (by_hand.peak, by_hand.reserved_peak)
    assert (with_lever.peak, with_lever.reserved_peak) != (base.peak, base.reserved_peak)
    if lever in ("checkpoint", "autocast", "grads-to-none"):  # the peak is the forward's, here
        assert with_lever.peak < base.peak
    assert report.changes_results == (lever == "autocast")
    summary = (tmp_path / "reports" / lever / "report.txt").read_text()
    assert f"Levers applied: {lever} ({detail})" in summary


def test_expandable_segments_save_what_the_variable_set_by_hand_saves(in_process, tmp_path, monkeypatch):
    script = write(tmp_path / "train.py", TRAIN)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    base = simulate(in_process, tmp_path, script, "base")
    with_lever = simulate(in_process, tmp_path, script, "lever", "--lever", "expandable")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"  # put back after the run
    [report] = with_lever.levers
    conf = "max_split_size_mb:512,expandable_segments:True"
    assert report["applied"] and report["change"] == f"PYTORCH_CUDA_ALLOC_CONF={conf}"
    assert report["where"] == "" and report["cost"] == "none"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
    by_hand = simulate(in_process, tmp_path, script, "by-hand")
    assert (with_lever.peak, with_lever.reserved_peak) == (by_hand.peak, by_hand.reserved_peak)
    assert with_lever.reserved_peak != base.reserved_peak  # the allocator model read it


GROWING = """
import torch

if FRACTION:  # 1 GiB for the allocator, whatever the GPU
    torch.cuda.set_per_process_memory_fraction(2**30 / torch.cuda.get_device_properties(0).total_memory)
for n in range(1, 16):  # each block larger than every cached one: a new segment each time
    x = torch.empty(n * 20 * 2**20, dtype=torch.uint8, device="cuda")
    del x
"""


@pytest.mark.parametrize("fraction", [True, False])
def test_gc_threshold_acts_only_under_a_memory_fraction(in_process, tmp_path, monkeypatch, fraction):
    """Blocks of 20, 40, ... 300 MiB, each freed, under a 1 GiB fraction. Without the
    threshold the cache grows to 900 MiB, block 10 (200 MiB) finds the limit and the whole
    cache is released (then 920 MiB at block 13). With ``garbage_collection_threshold:0.8``
    (``garbage_collect_cached_blocks``), block 10 finds 900 > 819.2 MiB reserved: the
    blocks at least the average age (5 searches: blocks 1-5, 300 MiB) are freed, and the
    cache reaches 1020 MiB at block 11. The lever gives what the variable set by hand
    gives; without a fraction the threshold does nothing."""
    script = write(tmp_path / "growing.py", GROWING.replace("FRACTION", str(fraction)))
    base = simulate(in_process, tmp_path, script, "base")
    with_lever = simulate(in_process, tmp_path, script, "lever", "--lever", "gc-threshold")
    [report] = with_lever.levers
    assert report["applied"] and "set_per_process_memory_fraction" in report["detail"]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8")
    by_hand = simulate(in_process, tmp_path, script, "by-hand")
    assert (with_lever.peak, with_lever.reserved_peak) == (by_hand.peak, by_hand.reserved_peak)
    mib = 2**20
    if fraction:
        assert (base.reserved_peak, with_lever.reserved_peak) == (920 * mib, 1020 * mib)
    else:
        assert with_lever.reserved_peak == base.reserved_peak == 1560 * mib  # the 2 GiB GPU's release


ALREADY = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
for step in range(3):
    x = torch.randn(512, 256, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_levers_the_script_already_has_are_not_applied_and_change_nothing(in_process, tmp_path):
    script = write(tmp_path / "already.py", ALREADY)
    levers = ("autocast", "fused", "no-foreach", "grads-to-none", "checkpoint")
    base = simulate(in_process, tmp_path, script, "base")
    run = simulate(in_process, tmp_path, script, "levers", *(f"--lever={name}" for name in levers))
    reports = read_levers(tmp_path / "reports" / "levers")
    assert [(r.name, r.applied, r.reason) for r in reports] == [
        ("autocast", False, "the script already autocasts (bfloat16): autocast changes nothing"),
        ("fused", False, "AdamW is already fused (fused=True)"),
        ("no-foreach", False, "AdamW is fused (fused=True): foreach does not apply"),
        (
            "grads-to-none",
            False,
            "every zero_grad() call (3) already sets gradients to None (torch's default since 2.0)",
        ),
        ("checkpoint", False, "Sequential has no ModuleList/Sequential of two or more blocks of one class"),
    ]
    assert all(r.change == r.detail == r.where == "" and r.reached for r in reports)
    assert (run.peak, run.reserved_peak) == (base.peak, base.reserved_peak)
    summary = (tmp_path / "reports" / "levers" / "report.txt").read_text()
    assert (
        "Levers applied: none; not applied: autocast (the script already autocasts (bfloat16): "
        "autocast changes nothing), fused (" in summary
    )


INFERENCE = (
    MODEL
    + """
model.eval()
with torch.no_grad():
    for step in range(3):
        out = model(torch.randn(1024, 256, device="cuda"))
"""
)


def test_levers_a_script_never_triggers_say_why(in_process, tmp_path):
    script = write(tmp_path / "infer.py", INFERENCE)
    simulate(
        in_process,
        tmp_path,
        script,
        "r",
        "--lever",
        "checkpoint",
        "--lever",
        "fused",
        "--lever",
        "grads-to-none",
    )
    assert [(r.applied, r.reason, r.reached) for r in read_levers(tmp_path / "reports" / "r")] == [
        (False, "no model was called with autograd recording (no training forward ran)", False),
        (False, "the script built no torch.optim optimizer while it ran", False),
        (False, "the script called no zero_grad()", False),
    ]


OTHERS = """
import torch
from torch import nn

model = nn.Linear(256, 256).cuda()
rms = torch.optim.RMSprop(model.parameters(), lr=1e-3)
on_cpu = torch.optim.Adam(nn.Linear(4, 4).parameters(), lr=1e-3)
loss = model(torch.randn(64, 256, device="cuda")).sum()
loss.backward()
rms.step()
"""


def test_fused_is_set_only_where_torch_has_it_and_the_parameters_are_on_cuda(in_process, tmp_path):
    script = write(tmp_path / "others.py", OTHERS)
    [fused, autocast, foreach] = simulate(
        in_process,
        tmp_path,
        script,
        "r",
        "--lever=fused",
        "--lever=autocast",
        "--lever=no-foreach",
        gpu="2GiB:sm75",
    ).levers
    assert foreach["detail"] == (
        "1 optimizer: RMSprop (left as they were: Adam's parameters are not all on CUDA: torch's default "
        "there is foreach=False already)"
    )
    assert not fused["applied"]
    assert fused["reason"] == (
        "RMSprop does not take fused; Adam's parameters are not all floating-point CUDA tensors"
    )
    # compute capability 7.5 has no bfloat16: float16, and the scaler it needs is not added
    assert autocast["applied"] and autocast["detail"] == (
        "float16; float16 training needs a torch.amp.GradScaler, which the lever does not add"
    )
    amp = 'with torch.autocast("cuda", dtype=torch.float16):'
    assert autocast["change"] == f'{amp} loss = model(torch.randn(64, 256, device="cuda")).sum()'
    assert autocast["cost"] == "numerics: float16 matmuls/activations (results change)"


def test_nothing_stays_patched_after_a_run_with_every_lever(in_process, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    call, init, zero = torch.nn.Module.__call__, torch.optim.AdamW.__init__, torch.optim.Optimizer.zero_grad
    module_zero, sgd = torch.nn.Module.zero_grad, torch.optim.SGD.__init__
    script = write(tmp_path / "train.py", TRAIN.replace("range(3)", "range(1)"))
    everything = [
        f"--lever={name}" for name in ("checkpoint", "autocast", "fused", "grads-to-none", "expandable")
    ]
    simulate(in_process, tmp_path, script, "r", *everything)
    assert all(r.applied for r in read_levers(tmp_path / "reports" / "r"))
    assert torch.nn.Module.__call__ is call and torch.optim.AdamW.__init__ is init
    assert torch.optim.Optimizer.zero_grad is zero and torch.nn.Module.zero_grad is module_zero
    assert torch.optim.SGD.__init__ is sgd
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ  # torch itself may set others (inductor's cache)


@pytest.mark.cuda
def test_levers_apply_on_a_real_gpu(tmp_path):
    """``run --device cuda --lever ...`` (as gpu-check runs a suggested change), in a
    process of its own: the allocator variable is read when CUDA starts."""
    import subprocess
    import sys

    script = write(tmp_path / "train.py", TRAIN.replace("range(3)", "range(2)"))
    levers = ("expandable", "checkpoint", "fused", "grads-to-none")
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--device", "cuda", "--run-name", "r"]
    command += [f"--lever={name}" for name in levers] + [str(script)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    reports = read_levers(tmp_path / "reports" / "r")
    assert [(r.name, r.applied, r.reason) for r in reports] == [(name, True, "") for name in levers]
    assert reports[0].detail == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert reports[1].detail == "4 x Block in h (8 block call(s) checkpointed)"
    assert reports[2].detail == "1 optimizer: AdamW"
    assert reports[3].detail == "2 zero_grad(set_to_none=False) call(s) set gradients to None"


def test_blocks_a_sequential_calls_are_checkpointed_as_a_loop_written_by_hand(in_process, tmp_path):
    text = TRAIN.replace(
        "nn.ModuleList(Block(d) for _ in range(n))", "nn.Sequential(*(Block(d) for _ in range(n)))"
    )
    text = text.replace("        for block in self.h:\n            x = block(x)\n", "        x = self.h(x)\n")
    script = write(tmp_path / "seq.py", text)
    with_lever = simulate(in_process, tmp_path, script, "lever", "--lever", "checkpoint")
    [report] = read_levers(tmp_path / "reports" / "lever")
    assert report.detail == "4 x Block in h (12 block call(s) checkpointed)"
    assert report.where == f"{script}:24"
    assert (
        report.change
        == "for block in self.h: x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"
    )
    by_hand = simulate(in_process, tmp_path, edited(script, report), "by-hand")
    base = simulate(in_process, tmp_path, script, "base")
    assert (with_lever.peak, with_lever.reserved_peak) == (by_hand.peak, by_hand.reserved_peak)
    assert with_lever.peak < base.peak


SUBCLASSES = """
import torch
from torch import nn


class Tuned(torch.optim.AdamW):
    def __init__(self, params):
        super().__init__(params, lr=1e-3)


class Plain(torch.optim.SGD):
    pass


model = nn.Linear(256, 256).cuda()
tuned = Tuned(model.parameters())
plain = Plain(model.parameters(), lr=0.1)
"""


def test_an_optimizer_subclass_gets_the_change_where_it_calls_torchs_constructor(in_process, tmp_path):
    script = write(tmp_path / "sub.py", SUBCLASSES)
    [fused] = simulate(in_process, tmp_path, script, "r", "--lever", "fused").levers
    assert fused["detail"] == "2 optimizers: Tuned, Plain"
    assert (fused["where"], fused["change"]) == (
        f"{script}:7",
        "super().__init__(params, lr=1e-3, fused=True)",
    )
    plain = write(tmp_path / "plain.py", SUBCLASSES.replace("tuned = Tuned(model.parameters())\n", ""))
    [foreach] = simulate(in_process, tmp_path, plain, "s", "--lever", "no-foreach").levers
    assert (foreach["detail"], foreach["where"]) == ("1 optimizer: Plain", f"{plain}:15")
    assert foreach["change"] == "plain = Plain(model.parameters(), lr=0.1, foreach=False)"


def test_levers_combined_save_what_both_changes_written_by_hand_save(in_process, tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    levers = ("--lever", "autocast", "--lever", "checkpoint", "--lever", "grads-to-none")
    combined = simulate(in_process, tmp_path, script, "combined", *levers)
    reports = read_levers(tmp_path / "reports" / "combined")
    assert [r.applied for r in reports] == [True, True, True]
    by_hand = script
    for report in reports:  # each change at its own line: the line numbers do not move
        by_hand = edited(by_hand, report)
    assert by_hand.read_text().count("torch.") == script.read_text().count("torch.") + 3
    hand = simulate(in_process, tmp_path, by_hand, "by-hand")
    assert (combined.peak, combined.reserved_peak) == (hand.peak, hand.reserved_peak)


def test_autocast_to_float32_in_the_script_is_not_mixed_precision(in_process, tmp_path):
    text = TRAIN.replace(
        "    out = model(x)\n",
        '    with torch.autocast("cuda", dtype=torch.float32):\n        out = model(x)\n',
    )
    script = write(tmp_path / "train.py", text)
    with_lever = simulate(in_process, tmp_path, script, "lever", "--lever", "autocast")
    [report] = read_levers(tmp_path / "reports" / "lever")
    assert (report.applied, report.detail) == (True, "bfloat16")
    assert report.change == 'with torch.autocast("cuda", dtype=torch.bfloat16): out = model(x)'
    by_hand = simulate(in_process, tmp_path, edited(script, report), "by-hand")
    assert (with_lever.peak, with_lever.reserved_peak) == (by_hand.peak, by_hand.reserved_peak)


def test_autocast_names_every_place_the_model_is_called(in_process, tmp_path):
    warm = "with torch.no_grad():\n    model(torch.randn(8, 256, device='cuda'))\n"
    script = write(
        tmp_path / "train.py", TRAIN.replace("optimizer = torch.optim", warm + "optimizer = torch.optim")
    )
    simulate(in_process, tmp_path, script, "r", "--lever", "autocast")
    [report] = read_levers(tmp_path / "reports" / "r")
    lines = script.read_text().splitlines()
    assert report.where == f"{script}:{lines.index('    out = model(x)') + 1}"  # the training forward
    evaluation = lines.index("    model(torch.randn(8, 256, device='cuda'))") + 1
    assert (
        report.detail
        == f"bfloat16 (the model is also called at {script}:{evaluation}: the change goes there too)"
    )


def test_the_scripts_own_mistake_reads_as_torchs_under_a_lever(in_process, tmp_path):
    script = write(tmp_path / "bad.py", MODEL + "torch.optim.AdamW(model.parameters(), lrr=1e-3)\n")
    out = tmp_path / "reports"
    done = in_process(
        "run", "--simulate", GPU, "--lever", "fused", "--out-dir", out, "--run-name", "r", script
    )
    assert done.returncode == 1
    assert "TypeError: AdamW.__init__() got an unexpected keyword argument 'lrr'" in done.stderr
    [report] = read_levers(out / "r")
    assert report.reason == "the script built no torch.optim optimizer while it ran"


def test_checkpoint_finds_the_model_past_a_small_module_called_first(in_process, tmp_path):
    text = TRAIN.replace("    out = model(x)\n", "    x = scale(x)\n    out = model(x)\n")
    text = text.replace(
        "model = Net().cuda()\n", "model = Net().cuda()\nscale = nn.Linear(256, 256).cuda()\n"
    )
    script = write(tmp_path / "two.py", text)
    simulate(in_process, tmp_path, script, "r", "--lever", "checkpoint")
    [report] = read_levers(tmp_path / "reports" / "r")
    assert (report.applied, report.detail) == (True, "4 x Block in h (12 block call(s) checkpointed)")


HF_TRAIN = """
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

CONFIG = GPT2Config(n_layer=3, n_embd=128, n_head=4, n_positions=128, vocab_size=1000)


class Wrapper(nn.Module):  # a script's own module around the library's model
    def __init__(self):
        super().__init__()
        self.lm = GPT2LMHeadModel(CONFIG)

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


model = {model}.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, 1000, (16, 128), device="cuda")
    loss = {loss}
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
"""


@pytest.mark.parametrize(
    ("model", "loss", "target"),
    [
        ("GPT2LMHeadModel(CONFIG)", "model(input_ids=ids, labels=ids).loss", "model"),
        ("Wrapper()", "model(ids)", "model.lm"),
    ],
)
def test_a_hugging_face_model_is_checkpointed_by_its_own_switch(in_process, tmp_path, model, loss, target):
    """The library's blocks are its code, not the script's: the change is the model's own
    ``gradient_checkpointing_enable`` call, and the lever makes that call (the library
    then also stops keeping its key/value cache), so the bytes are those of the script
    with that line written after the model is built; run with it, the lever is not applied."""
    transformers = pytest.importorskip("transformers")
    script = write(tmp_path / "train.py", HF_TRAIN.format(model=model, loss=loss))
    base = simulate(in_process, tmp_path, script, "base")
    with_lever = simulate(in_process, tmp_path, script, "lever", "--lever", "checkpoint")
    [report] = read_levers(tmp_path / "reports" / "lever")
    assert (report.applied, report.where) == (True, "")
    # the switch this transformers has: activation_checkpointing_enable from version 5
    new = hasattr(transformers.PreTrainedModel, "activation_checkpointing_enable")
    switch = "activation_checkpointing" if new else "gradient_checkpointing"
    blocks = "transformer.h" if target == "model" else "lm.transformer.h"
    assert report.detail == f"3 x GPT2Block in {blocks}, by GPT2LMHeadModel.{switch}_enable"
    assert report.change == f'{target}.{switch}_enable({switch}_kwargs={{"use_reentrant": False}})'
    text = script.read_text().replace("optimizer = ", f"{report.change}\noptimizer = ", 1)
    by_hand = simulate(in_process, tmp_path, write(tmp_path / "by_hand.py", text), "by-hand")
    assert (with_lever.peak, with_lever.reserved_peak) == (by_hand.peak, by_hand.reserved_peak)
    assert with_lever.peak < base.peak
    again = simulate(in_process, tmp_path, tmp_path / "by_hand.py", "again", "--lever", "checkpoint")
    [report] = read_levers(tmp_path / "reports" / "again")
    assert not report.applied and report.reason == (
        "GPT2LMHeadModel checkpoints its blocks already (its activation checkpointing is on)"
    )
    assert (again.peak, again.reserved_peak) == (by_hand.peak, by_hand.reserved_peak)


LOW = {
    "bf16 weights": (
        "model = Net().cuda()\n",
        "model = Net().cuda().to(torch.bfloat16)\n",
        "the model's weights are already bfloat16: autocast changes nothing",
    ),
    "accelerate": (  # as accelerate's prepare_model with mixed precision wraps the forward
        "model = Net().cuda()\n",
        "model = Net().cuda()\nmodel._original_forward = model.forward\n"
        'model.forward = torch.autocast("cuda", dtype=torch.bfloat16)(model.forward)\n',
        "the model's forward already runs under Accelerate's mixed-precision autocast (Trainer bf16/fp16): "
        "autocast changes nothing",
    ),
}


@pytest.mark.parametrize("case", list(LOW))
def test_autocast_is_not_applied_to_a_model_that_already_computes_in_bf16(in_process, tmp_path, case):
    old, new, reason = LOW[case]
    text = TRAIN.replace(old, new).replace(
        "    out = model(x)\n", "    out = model(x.to(next(model.parameters()).dtype)).float()\n"
    )
    script = write(tmp_path / "train.py", text)
    base = simulate(in_process, tmp_path, script, "base")
    run = simulate(in_process, tmp_path, script, "lever", "--lever", "autocast")
    [report] = read_levers(tmp_path / "reports" / "lever")
    assert (report.applied, report.reason, report.reached) == (False, reason, True)
    assert (run.peak, run.reserved_peak) == (base.peak, base.reserved_peak)
