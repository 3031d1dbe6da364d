"""Phases read in the trace's order: allocations without Python frames made while a line
runs ``backward()`` (or ``torch.autograd.backward``/``grad``) belong to backward, in the
``snapshot`` analysis, ``run --snapshot`` and on the real traces recorded on an H200."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import snapshotfiles as sf

from gpu_mem_track.allocator.replay import replay
from gpu_mem_track.snapshotfile import load_snapshot, snapshot_from_data
from gpu_mem_track.snapshots.analyse import analyse
from gpu_mem_track.snapshots.attribution import Attributor
from gpu_mem_track.snapshots.phases import read_trace, trace_phases

MIB = 2**20
BASE = sf.BASE
TORCH = "/opt/env/lib/python3.12/site-packages/torch"
H200 = sf.FIXTURES.parent / "h200" if sf.FIXTURES is not None else None


def py(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


def main(line: int) -> list[dict]:
    """The program's thread at ``line`` of the script, as ``stacks="python"`` records it."""
    return [py("/src/train.py", line, "<module>"), py("<frozen runpy>", 88, "_run_code")]


FORWARD = [
    py("/src/model.py", 7, "forward"),
    py(f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
    *main(12),
]
BACKWARD = [
    py(f"{TORCH}/autograd/__init__.py", 80, "_make_grads"),
    py(f"{TORCH}/autograd/__init__.py", 340, "backward"),
    py(f"{TORCH}/_tensor.py", 626, "backward"),
    *main(14),
]
OPTIMIZER = [py(f"{TORCH}/optim/adamw.py", 500, "step"), *main(15)]
GRAD = [py(f"{TORCH}/autograd/__init__.py", 412, "grad"), *main(17)]

#: (stack, phase expected) of each allocation, in order.
ALLOCATIONS = [
    (FORWARD, "forward"),
    (main(13), "other"),
    (BACKWARD, "backward"),  # the call starts: the loss's gradient
    ([], "backward"),  # the engine's thread
    (main(14)[:1], "backward"),  # the running line only (run --snapshot placed it)
    (main(14), "backward"),  # a C++ call of the line itself
    ([py("/src/hooks.py", 3, "hook")], "backward"),  # a hook the engine called
    ([], "backward"),
    (OPTIMIZER, "optimizer"),  # the program's thread moved on: the call has ended
    ([], "other"),
    (main(16), "other"),
    (GRAD, "backward"),  # torch.autograd.grad
    ([], "backward"),
    (main(18), "other"),
]


def python_only_trace() -> dict:
    """A 2 MiB segment and one 512 B request per row of ``ALLOCATIONS``, none freed."""
    trace = [dict(sf.entry("segment_alloc", BASE, 2 * MIB, 1), frames=FORWARD)]
    for k, (stack, _) in enumerate(ALLOCATIONS):
        trace.append(dict(sf.entry("alloc", BASE + 512 * k, 512, 2 + k), frames=stack))
    blocks = [(512, 512, "active_allocated")] * len(ALLOCATIONS)
    segment = sf.segment(BASE, [*blocks, (2 * MIB - 512 * len(ALLOCATIONS), 0, "inactive")], "small")
    return sf.snapshot([segment], trace)


def test_entries_without_python_frames_take_the_running_backward_call():
    trace = snapshot_from_data(python_only_trace()).device_traces[0]
    phases = trace_phases(trace, Attributor())
    assert phases == ["forward", *(phase for _, phase in ALLOCATIONS)]


def test_the_analysis_counts_them_in_backward():
    snapshot = snapshot_from_data(python_only_trace(), "phases.pickle")
    analysis = analyse(snapshot, replay(snapshot, 0), Attributor())
    table = {c.name: (c.hits, c.allocated, c.live_at_peak) for c in analysis.categories}
    assert table == {
        "backward": (8, 8 * 512, 8 * 512),
        "other": (4, 4 * 512, 4 * 512),
        "forward": (1, 512, 512),
        "optimizer": (1, 512, 512),
    }
    assert analysis.peak.category == "other"  # the last allocation set the peak
    assert replay(snapshot, 0).check.exact
    # entries without frames go to the line that called backward, not to <no frames>
    lines = {(u.file, u.line): (u.hits, u.category) for u in analysis.lines}
    assert lines[("/src/train.py", 14)] == (5, "backward")  # the call, 2 frameless, 2 of its own
    assert lines[("/src/train.py", 17)] == (2, "backward")  # torch.autograd.grad and 1 frameless
    assert lines[("<no frames>", 0)] == (1, "other")  # made while no backward call ran


def test_frameless_entries_are_charged_to_the_line_running_backward():
    trace = snapshot_from_data(python_only_trace()).device_traces[0]
    reading = read_trace(trace, Attributor())
    owners = {index: (site.file, site.line) for index, site in reading.owners.items()}
    assert owners == {4: ("/src/train.py", 14), 8: ("/src/train.py", 14), 13: ("/src/train.py", 17)}


def test_without_a_backward_call_frameless_entries_stay_other():
    data = python_only_trace()
    data["device_traces"][0] = [e for e in data["device_traces"][0] if e["frames"] not in (BACKWARD, GRAD)]
    trace = snapshot_from_data(data).device_traces[0]
    assert set(trace_phases(trace, Attributor())) == {"forward", "other", "optimizer"}


@pytest.mark.skipif(H200 is None or not (H200 / "nanogpt-char.pickle.gz").is_file(), reason="no H200 traces")
def test_the_real_nanogpt_trace_puts_autograds_allocations_in_backward():
    """Before: backward 6.5 KiB in 13 allocations, other 30.47 GiB in 3,235."""
    snapshot = load_snapshot(H200 / "nanogpt-char.pickle.gz")
    analysis = analyse(snapshot, replay(snapshot, 0), Attributor())
    table = {c.name: (c.hits, c.allocated) for c in analysis.categories}
    assert table == {
        "forward": (3001, 36_362_236_928),
        "backward": (2562, 32_669_185_024),
        "optimizer": (117, 86_570_496),
        "other": (686, 48_025_088),
    }


# -- run --snapshot, on the fake GPU of test_runner_snapshot -----------------------------

TENSOR = """\
def backward(gpu):
    ones = gpu.alloc(512)
    grads = gpu.alloc(6 * 2**20, stack=False)
    gpu.free(ones, stack=False)
    return grads
"""
SCRIPT = """\
import importlib.util, sys, fakegpu
spec = importlib.util.spec_from_file_location("fake_tensor", sys.argv[1])
tensor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tensor)
weights = fakegpu.alloc(8 * 2**20)
grads = tensor.backward(fakegpu)
state = fakegpu.alloc(4 * 2**20)
"""


def test_run_snapshot_counts_the_engines_allocations_in_backward(tmp_path, monkeypatch):
    """The engine's allocation has no stack; the runner gives it the running line (6),
    whose phase is the backward call that line runs (in a file named as torch's)."""
    from test_runner_snapshot import FakeGpu, _NoDriver, _Sink

    from gpu_mem_track.devices import Device
    from gpu_mem_track.runner.options import RunOptions
    from gpu_mem_track.runner.run import execute, prepare
    from gpu_mem_track.runner.samplers import CudaSampler

    gpu = FakeGpu()
    module = type(sys)("fakegpu")
    module.alloc, module.free = gpu.alloc, gpu.free
    monkeypatch.setitem(sys.modules, "fakegpu", module)
    (tmp_path / "torch").mkdir()
    tensor = tmp_path / "torch" / "_tensor.py"
    tensor.write_text(TENSOR)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    prepared = prepare(
        RunOptions(script=str(script), args=(str(tensor),), out_dir=str(tmp_path), run_name="r", device="cpu")
    )
    options = replace(prepared.options, snapshot=True, snapshot_entries=1000)
    prepared = replace(prepared, options=options, device=Device("cuda", 0))
    sampler = CudaSampler("cuda:0", reader=_NoDriver(), stats=gpu.stats)
    result = execute(prepared, _Sink(), sampler=sampler, history=gpu)
    assert result.exit_code == 0 and result.snapshot.placed == 2 and not result.snapshot.note
    analysis = json.loads((result.folder / "snapshot.json").read_text())
    table = {c["name"]: (c["hits"], c["allocated"]) for c in analysis["categories"]}
    assert table == {"other": (2, 12 * MIB), "backward": (2, 6 * MIB + 512)}
    lines = {(Path(u["file"]).name, u["line"]): u["category"] for u in analysis["lines"]}
    assert lines[("train.py", 6)] == "backward" and lines[("train.py", 7)] == "other"
    assert importlib.util.find_spec("fake_tensor") is None  # nothing left behind
