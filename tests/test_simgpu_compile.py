"""torch.compile on the simulated GPU (``simgpu.compiled``): each compiling call recorded
at its line, the region run as eager code (same memory as without compile), the
originals put back, and ``run --simulate`` saying so in its summary, report and
meta.json (read back checked); a script without torch.compile says nothing of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu_mem_track.errors import BadInput
from gpu_mem_track.runfolder.files import read_meta, write_meta
from gpu_mem_track.runfolder.records import RunInfo, SimulationInfo
from gpu_mem_track.runfolder.simtext import compiled_note, simulation_report
from gpu_mem_track.simgpu import GPUS, Compiled, simulated_gpu

ROOT = Path(__file__).resolve().parents[1]
HERE = str(Path(__file__).resolve())


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))


def _step(model: nn.Module) -> int:
    x = torch.randn(64, 256, device="cuda")
    model(x).sum().backward()
    return torch.cuda.max_memory_allocated()


def test_each_compiling_call_is_recorded_at_its_line_once():
    with simulated_gpu("a100-40gb") as gpu:
        model = _model().cuda()
        compiled = torch.compile(model)
        line_compile = sys._getframe().f_lineno - 1
        other = _model().cuda()
        other.compile(mode="max-autotune")
        line_module = sys._getframe().f_lineno - 1

        @torch.compile(mode="reduce-overhead")
        def double(x):
            return x * 2

        line_decorator = sys._getframe().f_lineno - 4
        triple = torch._dynamo.optimize("aot_eager")(lambda x: x * 3)
        line_optimize = sys._getframe().f_lineno - 1
        for _ in range(2):
            torch.compile(model, backend="eager")
        line_loop = sys._getframe().f_lineno - 1
        torch.compile(model, disable=True)
        _step(compiled)
        double(torch.ones(3, device="cuda"))
        triple(torch.ones(3, device="cuda"))
    assert gpu.compiled == [
        Compiled(HERE, line_compile, "torch.compile", "inductor", "default"),
        Compiled(HERE, line_module, "nn.Module.compile", "inductor", "max-autotune"),
        Compiled(HERE, line_decorator, "torch.compile", "inductor", "reduce-overhead"),
        Compiled(HERE, line_optimize, "torch._dynamo.optimize", "aot_eager", ""),
        Compiled(HERE, line_loop, "torch.compile", "eager", "default", count=2),
    ]


def test_a_compiled_region_runs_as_eager_code_and_the_originals_are_put_back():
    originals = (torch.compile, torch.nn.Module.compile, torch._dynamo.optimize)
    torch.manual_seed(0)
    with simulated_gpu("a100-40gb"):
        eager_peak = _step(_model().cuda())
    with simulated_gpu("a100-40gb") as gpu:
        compiled = torch.compile(_model().cuda())
        assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
        compiled_peak = _step(compiled)
    # Dynamo skips every frame under the simulation's dispatch modes: eager memory. If a
    # torch release makes Dynamo trace here, this fails and simgpu.compiled must change.
    assert compiled_peak == eager_peak and len(gpu.compiled) == 1
    assert (torch.compile, torch.nn.Module.compile, torch._dynamo.optimize) == originals


def _sim(*compiled: dict) -> SimulationInfo:
    return SimulationInfo(gpu=GPUS["t4"].to_dict(), compiled=compiled)


def _record(line: int, api: str = "torch.compile", backend: str = "inductor", mode: str = "default", count=1):
    return {
        "filename": "train.py",
        "line": line,
        "api": api,
        "backend": backend,
        "mode": mode,
        "count": count,
    }


def test_the_note_names_each_site_and_says_eager():
    assert compiled_note(_sim()) == ""
    assert compiled_note(_sim(_record(201))) == (
        "torch.compile at train.py:201: 1 compiled region simulated as eager; Inductor's saved "
        "tensors and buffers are not modelled, so the peak may differ"
    )
    note = compiled_note(
        _sim(_record(9, mode="reduce-overhead"), _record(12, "torch._dynamo.optimize", "aot_eager", "", 3))
    )
    assert note == (
        "torch.compile(mode='reduce-overhead') at train.py:9; torch._dynamo.optimize(backend='aot_eager') "
        "at train.py:12 (x3): 4 compiled regions simulated as eager; Inductor's saved tensors and "
        "buffers are not modelled, so the peak may differ; CUDA graphs' private memory pool is not "
        "modelled either"
    )
    assert compiled_note(_sim(_record(3, backend="aot_eager"))).endswith(
        "the compiler's saved tensors are not modelled, so the peak may differ"
    )
    assert note + "." in simulation_report(
        _sim(_record(9, mode="reduce-overhead"), _record(12, "torch._dynamo.optimize", "aot_eager", "", 3))
    )


def test_compiled_regions_read_back_from_meta_json_and_a_damaged_one_is_one_line(tmp_path):
    info = RunInfo(
        "r", "t.py", ("t.py",), "cuda:0", "cuda allocator", "sys.settrace", 1.0, "3.11", "2", "0.1"
    )
    info = replace(info, simulation=_sim(_record(5)))
    path = tmp_path / "meta.json"
    write_meta(path, info)
    assert read_meta(path) == info
    data = json.loads(path.read_text())
    data["simulation"]["compiled"][0]["line"] = "five"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match="'simulation.compiled' lacks 'line' as int"):
        read_meta(path)
    del data["simulation"]["compiled"]  # a file written before compiled regions were recorded
    path.write_text(json.dumps(data))
    assert read_meta(path).simulation.compiled == ()


SCRIPT = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
if COMPILE:
    model = torch.compile(model)
x = torch.randn(64, 256, device="cuda")
model(x).sum().backward()
"""


@pytest.mark.parametrize("compiled", [True, False])
def test_run_simulate_says_a_compiled_region_was_simulated_as_eager(tmp_path, compiled):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("COMPILE", str(compiled)).lstrip())
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--run-name", "r", "--simulate", "a100-40gb"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*command, "train.py"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "reports" / "r"
    sim = read_meta(folder / "meta.json").simulation
    note = "torch.compile at train.py:6: 1 compiled region simulated as eager; Inductor's saved tensors"
    if compiled:
        assert sim.compiled == (_record(6) | {"filename": str(script)},)
        assert note in done.stdout + done.stderr
        assert note in (folder / "report.txt").read_text()
    else:
        assert sim.compiled == ()
        assert "compiled region" not in done.stdout + done.stderr
        assert "compiled region" not in (folder / "report.txt").read_text()
