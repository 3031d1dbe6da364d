"""The levers' data and text: names and ranks, the reports' file format, the allocator
variable's merge, the edited lines the reports give, and the command's one-line mistakes."""

from __future__ import annotations

import json

import pytest

from gpu_mem_track.errors import UsageError
from gpu_mem_track.levers import LEVERS, LeverReport, check_levers, describe, read_levers
from gpu_mem_track.levers.allocator import AllocatorLever, merge_conf, split_conf
from gpu_mem_track.levers.source import call_with_keyword, callee, prefixed, wrapped_call
from gpu_mem_track.runfolder.records import RunInfo


def test_levers_are_named_cheapest_first_with_their_costs():
    assert LEVERS == (
        "expandable",
        "grads-to-none",
        "no-foreach",
        "fused",
        "gc-threshold",
        "autocast",
        "checkpoint",
    )
    assert [describe(name).rank for name in LEVERS] == list(range(7))
    assert describe("checkpoint").cost == "about one more forward pass of compute"
    assert describe("autocast").cost == "numerics: bfloat16 matmuls/activations (results change)"
    assert describe("expandable").cost == "none"
    assert [name for name in LEVERS if describe(name).changes_results] == ["autocast"]
    assert describe("expandable").change == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def test_unknown_and_repeated_levers_are_one_line_mistakes():
    with pytest.raises(UsageError, match=r"unknown lever 'amp'; the levers are: expandable, grads-to-none"):
        describe("amp")
    with pytest.raises(UsageError, match="--lever fused is given twice"):
        check_levers(["fused", "checkpoint", "fused"])
    assert check_levers(["checkpoint", "expandable"]) == ("checkpoint", "expandable")


def test_a_report_round_trips_through_meta_json_and_old_runs_have_none(tmp_path):
    report = LeverReport(
        "fused", True, "", "1 optimizer: AdamW", "opt = AdamW(p, fused=True)", "t.py:3", "none"
    )
    info = RunInfo("r", "t.py", ("t.py",), "cuda:0", "cuda allocator", "sys.monitoring", 0.0, "3.11", "", "")
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(info.__class__(**{**info.__dict__, "levers": (report.to_dict(),)}).to_dict()))
    assert json.loads(meta.read_text())["levers"][0]["detail"] == "1 optimizer: AdamW"
    assert read_levers(tmp_path) == [report]
    old = info.to_dict()
    del old["levers"]  # a run folder written before levers existed
    meta.write_text(json.dumps(old))
    assert read_levers(tmp_path) == []
    assert RunInfo.from_dict(old).levers == ()
    with pytest.raises(UsageError, match="cannot read"):
        read_levers(tmp_path / "missing")


def test_the_allocator_variable_is_merged_into_the_users():
    conf = "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2],expandable_segments:False"
    assert split_conf(conf) == [
        "max_split_size_mb:128",
        "roundup_power2_divisions:[256:1,512:2]",
        "expandable_segments:False",
    ]
    assert merge_conf(conf, "expandable_segments", "True") == (
        "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2],expandable_segments:True"
    )
    assert merge_conf("", "expandable_segments", "True") == "expandable_segments:True"


def test_the_allocator_levers_set_the_variable_for_the_run_only(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    lever = AllocatorLever("expandable", simulated=True)
    lever.install()
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64,expandable_segments:True"
    lever.uninstall()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"
    report = lever.report()
    assert (
        report.applied
        and report.change == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64,expandable_segments:True"
    )

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:true")
    already = AllocatorLever("expandable", simulated=True)
    already.install()
    already.uninstall()
    assert already.report().reason == "PYTORCH_CUDA_ALLOC_CONF already sets expandable_segments:true"

    gc = AllocatorLever("gc-threshold", simulated=True)  # modelled: set for the simulated GPU too
    gc.install()
    conf = os.environ["PYTORCH_CUDA_ALLOC_CONF"]
    assert conf == "expandable_segments:true,garbage_collection_threshold:0.8"
    gc.uninstall()
    assert gc.report().applied and "set_per_process_memory_fraction" in gc.report().detail
    real = AllocatorLever("gc-threshold", simulated=False)
    real.install()
    assert (
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:true,garbage_collection_threshold:0.8"
    )
    real.uninstall()
    assert real.report().applied and "set_per_process_memory_fraction" in real.report().detail


def test_the_edited_line_keeps_the_users_text():
    line = "optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=betas, **extra)  # note"
    assert call_with_keyword(line, "AdamW", "fused", True, "F") == (
        "optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=betas, **extra, fused=True)  # note"
    )
    assert call_with_keyword("opt = SGD(p, foreach=True, lr=1)", "SGD", "foreach", False, "F") == (
        "opt = SGD(p, foreach=False, lr=1)"
    )
    assert call_with_keyword(
        "loss.backward(); opt.zero_grad(set_to_none=False)", "zero_grad", "set_to_none", True, "F"
    ) == ("loss.backward(); opt.zero_grad(set_to_none=True)")
    assert call_with_keyword("opt = make(", "make", "fused", True, "F") == "F"  # a call over several lines
    assert call_with_keyword("é = SGD(p)", "SGD", "fused", True, "F") == "é = SGD(p, fused=True)"
    checkpoint = "torch.utils.checkpoint.checkpoint"
    assert wrapped_call("x = block(x)", checkpoint, "use_reentrant=False", "F") == (
        "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"
    )
    assert wrapped_call("h, a = self.layer(h, mask=m, **kw)", checkpoint, "use_reentrant=False", "F") == (
        "h, a = torch.utils.checkpoint.checkpoint(self.layer, h, mask=m, **kw, use_reentrant=False)"
    )
    assert wrapped_call("for b in h: x = b(x)", checkpoint, "use_reentrant=False", "F") == "F"
    amp = 'with torch.autocast("cuda", dtype=torch.bfloat16):'
    assert prefixed("logits, loss = model(X, Y)", amp, "F") == f"{amp} logits, loss = model(X, Y)"
    assert prefixed("if x: y = model(x)", amp, "F") == "F"
    assert callee("loss = model(input_ids=ids, labels=ids).loss") == "model"
    assert callee("out = self.net.lm(x)") == "self.net.lm"
    assert callee("loss = criterion(model(x), y)") is None  # two calls: which is the model's?
    assert callee("out = models[0](x)") is None and callee("out = model(") is None


def test_the_run_command_refuses_levers_it_cannot_apply(in_process, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    out = tmp_path / "reports"
    done = in_process("run", "--lever", "amp", "--simulate", "2GiB:sm80", "--out-dir", out, script)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpu_mem_track: unknown lever 'amp'; the levers are: expandable, grads-to-none, no-foreach, "
        "fused, gc-threshold, autocast, checkpoint, zero, fsdp2, no-reshard, fsdp2-bf16, cpu-offload"
    ]
    done = in_process(
        "run", "--lever", "fused", "--lever", "fused", "--simulate", "2GiB:sm80", "--out-dir", out, script
    )
    assert done.returncode == 2 and done.stderr.strip() == "gpu_mem_track: --lever fused is given twice"
    done = in_process("run", "--device", "cpu", "--lever", "checkpoint", "--out-dir", out, script)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpu_mem_track: --lever changes how the script uses a CUDA GPU: give --simulate GPU or "
        "--device cuda (this run would be on cpu)"
    )
    assert "ran" not in done.stdout and not out.exists()  # refused before the script ran


def test_run_help_names_every_lever(in_process):
    done = in_process("run", "--help")
    text = " ".join(done.stdout.split())
    assert ", ".join(LEVERS) in text


def test_the_levers_package_imports_no_torch_and_sits_below_the_runner():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = "import sys, gpu_mem_track.levers as l; l.describe('fused'); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
    for path in (root / "gpu_mem_track" / "levers").glob("*.py"):
        text = path.read_text()
        for above in ("..runner", "..commands", "..estimator", "..simgpu", "..tracker"):
            assert f"from {above}" not in text, f"{path.name} imports {above}"


def test_repeated_blocks_are_a_containers_children_of_one_class_or_its_blocks_beside_a_head():
    from torch import nn

    from gpu_mem_track.levers.checkpoint import repeated_blocks

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

    same = nn.Sequential(Block(), Block())
    found = repeated_blocks(same)
    assert found is not None and found.blocks == list(same) and found.span() == "" and not found.mixed
    headed = nn.Sequential(nn.Linear(8, 8), Block(), Block(), Block(), nn.Linear(8, 2))
    found = repeated_blocks(headed)
    assert found is not None and found.blocks == list(headed)[1:4] and found.span() == "[1:4]"
    tail = nn.ModuleList([Block(), Block(), nn.LayerNorm(8)])
    assert repeated_blocks(tail).span() == "[:2]"
    scattered = nn.Sequential(Block(), nn.Linear(8, 8), Block())
    assert repeated_blocks(scattered).span() is None
    # Leaf layers among others are no blocks (an MLP's Linears); all of one class they are.
    assert repeated_blocks(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))) is None
    assert repeated_blocks(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))).span() == ""
    assert repeated_blocks(nn.Sequential(nn.ReLU(), nn.ReLU())) is None  # no parameters


def test_a_block_is_named_by_the_class_the_script_wrote_under_fsdp2():
    from torch import nn

    from gpu_mem_track.levers.checkpoint import block_class

    class Block(nn.Module):
        pass

    sharded = type("FSDPBlock", (Block,), {})  # as fully_shard swaps a module's class
    assert block_class(sharded()) == "Block" and block_class(Block()) == "Block"
    assert block_class(nn.Linear(1, 1)) == "Linear"
