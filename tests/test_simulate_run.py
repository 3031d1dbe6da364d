"""``run --simulate`` end to end: a training script on a simulated GPU in a subprocess
(the runner's own CUDA sampler reading the model), the run folder read back unchanged,
out-of-memory caught and uncaught, ``--snapshot``, the stop rule on a real run, the
``gpus`` command, ``%%memtrack --simulate`` and the one-line mistakes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_mem_track.cli import main
from gpu_mem_track.runfolder.files import read_lines, read_meta
from gpu_mem_track.simgpu import GPUS

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def simulate(tmp_path: Path, script: str, *options: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--run-name", "r", *options, script]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)


TRAIN = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
try:
    for step in range(100000):
        x = torch.randn(64, 1024, device="cuda")
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}")
finally:
    print("finally ran", torch.cuda.get_device_name(), torch.cuda.max_memory_allocated())
"""


@pytest.mark.slow
def test_a_training_script_runs_on_the_simulated_gpu_until_steady(tmp_path):
    write(tmp_path / "train.py", TRAIN)
    done = simulate(tmp_path, "train.py", "--simulate", "a100-40gb")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "reports" / "r"
    info = read_meta(folder / "meta.json")
    # the runner's CUDA sampler read the allocator model: parameters, Adam's state...
    assert info.device == "cuda:0" and info.memory_source == "cuda allocator"
    params = (1024 * 4096 + 4096 + 4096 * 1024 + 1024) * 4
    assert info.peak > 3 * params and info.reserved_peak >= info.peak
    # ...and the script's own max_memory_allocated() saw the same peak, in its finally block
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"finally ran NVIDIA A100-SXM4-40GB {info.peak}"
    assert info.simulation.gpu["name"] == "A100-40GB"
    assert info.simulation.gpu["total_memory"] == GPUS["a100-40gb"].total_memory
    assert info.stopped.reason == "steady" and info.stopped.line == 7
    assert info.stopped.action == "left-loop" and info.stopped.skipped == 100000 - 4
    assert info.stopped.iterations == 4  # 2 of warm-up, 2 unchanged
    assert done.stdout.count("loss") == 4  # printed from a placeholder: 0.000
    placeholders = info.simulation.placeholders
    assert [(p["line"], p["op"], p["count"]) for p in placeholders] == [(13, "item", 4)]
    report = (folder / "report.txt").read_text()
    assert "Simulated GPU: A100-40GB" in report
    assert "Left the loop at train.py:7 after 4 iteration(s)" in report
    assert "99,996 iteration(s) skipped, the script went on at train.py:15" in report
    assert "train.py:13  item  x4" in report
    records = {r.line: r for r in read_lines(folder / "lines.csv")}
    assert records[11].hits == 4 and records[11].peak == info.peak  # the optimizer step peaks
    # the folder is an ordinary run folder: show reads it back
    shown = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", "show", str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert shown.returncode == 0 and "Simulated GPU: A100-40GB" in shown.stdout


@pytest.mark.slow
def test_an_uncaught_oom_ends_the_script_as_python_would_and_names_the_line(tmp_path):
    write(
        tmp_path / "oom.py",
        """
        import torch
        keep = []
        for i in range(100):
            keep.append(torch.empty(2**30, dtype=torch.uint8, device="cuda"))
        print("never")
        """,
    )
    done = simulate(tmp_path, "oom.py", "--simulate", "T4")
    assert done.returncode == 1
    assert "never" not in done.stdout
    # the traceback ends at the script's line, as on a GPU: none of the simulation's frames
    assert done.stderr.splitlines()[1].endswith('oom.py", line 4, in <module>')
    assert "simgpu" not in done.stderr.split("torch.OutOfMemoryError")[0]
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB" in done.stderr
    info = read_meta(tmp_path / "reports" / "r" / "meta.json")
    oom = info.simulation.out_of_memory
    assert oom["line"] == 4 and oom["request"] == 2**30
    assert oom["capacity"] == GPUS["t4"].capacity
    assert oom["allocated"] == 14 * 2**30 and oom["reserved"] == 14 * 2**30
    report = (tmp_path / "reports" / "r" / "report.txt").read_text()
    assert "Would run out of memory at oom.py:4: 1.00 GiB requested with 14.00 GiB allocated" in report
    assert "(uncaught)" in report


@pytest.mark.slow
def test_a_caught_oom_lets_the_script_go_on(tmp_path):
    write(
        tmp_path / "halve.py",
        """
        import torch
        batch = 2**18  # 64 GiB of float32 rows of 256 KiB: too much for a 40 GB GPU
        while True:
            try:
                x = torch.empty(batch, 2**16, device="cuda")
                break
            except torch.cuda.OutOfMemoryError:
                batch //= 2
        print("fits", batch)
        """,
    )
    done = simulate(tmp_path, "halve.py", "--simulate", "a100-40gb")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fits 131072"  # 32 GiB fits in 39.2 GiB
    info = read_meta(tmp_path / "reports" / "r" / "meta.json")
    assert info.simulation.out_of_memory["line"] == 5
    report = (tmp_path / "reports" / "r" / "report.txt").read_text()
    assert "Would run out of memory at halve.py:5" in report and "the script caught it and went on" in report


@pytest.mark.slow
def test_snapshot_records_the_simulated_allocator(tmp_path):
    from gpu_mem_track.snapshotfile.load import load_snapshot

    write(
        tmp_path / "small.py",
        """
        import torch
        a = torch.empty(1, device="cuda")
        b = torch.empty(3 * 2**20, device="cuda")
        del a
        """,
    )
    done = simulate(tmp_path, "small.py", "--simulate", "h100-80gb", "--snapshot")
    assert done.returncode == 0, done.stderr
    snapshot = load_snapshot(tmp_path / "reports" / "r" / "snapshot.pickle")
    allocs = [
        (e.action, e.size) for e in snapshot.device_traces[0] if e.action in ("alloc", "free_requested")
    ]
    # b is a global of the script: as under python, it lives until the reports are written
    assert allocs == [("alloc", 4), ("alloc", 12 * 2**20), ("free_requested", 4)]
    records = {r.line: r for r in read_lines(tmp_path / "reports" / "r" / "lines.csv")}
    assert records[2].peak == 512 and records[2].peak_exact  # PyTorch's oracle: 512 B blocks
    assert records[3].peak == 512 + 12 * 2**20
    # reserved: a 2 MiB small-pool segment, then a 12 MiB one (over 10 MiB: rounded to 2 MiB)
    assert (records[2].reserved_peak, records[3].reserved_peak) == (2 * 2**20, 14 * 2**20)


def test_the_stop_rule_ends_a_long_cpu_loop_with_its_finally_and_reports(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path / "loop.py",
        """
        done = []
        try:
            for step in range(10**9):
                try:
                    done.append(step)
                except Exception:
                    print("swallowed")
        finally:
            print("finally after", len(done))
        """,
    )
    code = main(["run", "--device", "cpu", "--run-name", "r", "--max-iterations", "25", "loop.py"])
    assert code == 0
    out = capsys.readouterr()
    assert out.out == "finally after 25\n"
    info = read_meta(tmp_path / "reports" / "r" / "meta.json")
    assert info.stopped.reason == "max-iterations" and info.stopped.iterations == 25
    assert info.stopped.line == 3 and info.exit_code == 0
    assert "Left the loop at loop.py:3 after 25 iteration(s)" in out.err
    assert f"{10**9 - 25:,} iteration(s) skipped, the script went on at loop.py:9" in out.err
    assert "--max-iterations reached" in (tmp_path / "reports" / "r" / "report.txt").read_text()


def test_gpus_lists_the_catalog(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    rows = [
        line
        for line in out.splitlines()
        if line.split() and line.split()[0] in {s.name for s in GPUS.values()}
    ]
    assert len(rows) == len(GPUS) >= 12
    h100 = next(r for r in rows if r.startswith("H100-80GB"))
    assert "79.19 GiB" in h100 and " 9.0 " in h100 and "32.00 MiB" in h100
    assert "A100-40GB: published" in out  # each figure's source
    assert main(["gpus", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    a100 = next(g for g in data["gpus"] if g["name"] == "A100-40GB")
    assert a100["total_memory"] == 40536 * 2**20 and a100["capability"] == [8, 0]
    assert a100["capacity"] == a100["total_memory"] - a100["context_bytes"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--simulate", "b200"], "unknown GPU 'b200': choose one of V100-16GB, "),
        (["--simulate", "t4", "--device", "cpu"], "cannot run on --device cpu"),
        (["--simulate", "t4", "--memory", "heap"], "--memory heap measures the CPU"),
        (["--run-to-end"], "--run-to-end only applies with --simulate"),
        (["--max-iterations", "0"], "--max-iterations must be at least 1"),
        (["--max-seconds", "0"], "--max-seconds must be above 0"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "s.py", "print('ran')\n")
    assert main(["run", *options, "s.py"]) == 2
    err = capsys.readouterr()
    assert err.out == ""
    assert err.err.count("\n") == 1 and message in err.err
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def test_cell_magic_runs_a_cell_on_a_simulated_gpu():
    pytest.importorskip("IPython")
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.lib.pretty import pretty

    shell = InteractiveShell.instance()
    if "gpu_mem_track" not in shell.extension_manager.loaded:
        shell.run_line_magic("load_ext", "gpu_mem_track")
    shell.user_ns["torch"] = torch
    cell = "w = torch.empty(1024, 1024, device='cuda')\nname = torch.cuda.get_device_name()\n"
    profile = shell.run_cell_magic("memtrack", "--simulate L4", cell)
    assert profile.device == "cuda:0" and profile.source == "cuda allocator"
    assert profile.peak == 4 * 2**20
    assert profile.simulation.gpu["name"] == "L4"
    assert shell.user_ns["name"] == "NVIDIA L4"
    assert "simulated L4" in pretty(profile) and "simulated L4" in profile._repr_html_()
    assert not torch.cuda.is_available()  # the simulation lasted for the cell only
    for name in ("w", "name"):
        shell.user_ns.pop(name, None)


class ReservingSampler:
    """The CUDA sampler's shape: allocated and its peak, reserved and its peak."""

    source = "cuda allocator"
    events = 0

    def __init__(self) -> None:
        self.current = self.high = self.reserved = self.reserved_peak = 0

    def grow(self, allocated: int, reserved: int) -> None:
        self.current += allocated
        self.high = max(self.high, self.current)
        self.reserved += reserved
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def sample(self) -> tuple[int, int]:
        return self.current, self.high

    def extras(self) -> tuple[None, None]:
        return None, None

    def close(self) -> None:
        pass


def test_each_line_gets_its_reserved_peak(tmp_path):
    from gpu_mem_track.runner.profiler import LineProfiler

    path = write(tmp_path / "lines.py", "a = 1\nb = 2\nc = 3\n")
    code = compile(path.read_text(), str(path), "exec")
    sampler = ReservingSampler()
    profiler = LineProfiler(sampler)
    profiler.enter(code)
    profiler.line(code, 1)
    sampler.grow(4 * 2**20, 20 * 2**20)  # line 1: a 20 MiB segment
    profiler.line(code, 2)
    sampler.grow(-4 * 2**20, 0)
    sampler.reserved -= 20 * 2**20  # line 2: frees it and empties the cache
    profiler.line(code, 3)
    profiler.leave(code)
    peaks = {r.line: r.reserved_peak for r in profiler.records()}
    # line 2 never raised the reserved peak: the larger of its before and after readings
    assert peaks == {1: 20 * 2**20, 2: 20 * 2**20, 3: 0}


def test_simulate_under_torchrun_gives_the_rank_its_own_gpu(tmp_path):
    from gpu_mem_track.runner.options import RunOptions
    from gpu_mem_track.runner.run import prepare

    script = write(tmp_path / "s.py", "print('ran')\n")
    options = RunOptions(script=str(script), out_dir=str(tmp_path / "reports"), simulate="a100-40gb")
    prepared = prepare(options, environ={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (prepared.gpu.name, str(prepared.device), prepared.rank.rank) == ("A100-40GB", "cuda:1", 1)


def test_saved_activations_are_placed_at_the_users_line_not_inside_the_package():
    """The simulated GPU's frames (gpu_mem_track/simgpu) sit between the user's line and
    the op; the line a saved tensor is attributed to is the user's."""
    import gpu_mem_track
    from gpu_mem_track.tracker.saved import user_site

    inside = os.path.join(os.path.dirname(gpu_mem_track.__file__), "simgpu", "face.py")
    namespace: dict = {"user_site": user_site, "sys": sys}
    exec(compile("def op():\n    return user_site(sys._getframe())\n", inside, "exec"), namespace)
    where = namespace["op"]()  # this line calls the package's frame
    line = sys._getframe().f_lineno - 1
    assert where == f"test_simulate_run.py:{line}"


def test_a_simulated_runs_meta_json_reads_back_and_a_damaged_one_is_one_line(tmp_path):
    from dataclasses import replace

    from gpu_mem_track.errors import BadInput
    from gpu_mem_track.runfolder.files import write_meta
    from gpu_mem_track.runfolder.records import RunInfo, SimulationInfo, StopInfo

    oom = {
        "filename": "t.py",
        "line": 4,
        "request": 2,
        "allocated": 3,
        "reserved": 4,
        "capacity": 5,
        "message": "m",
    }
    info = RunInfo(
        "r", "t.py", ("t.py",), "cuda:0", "cuda allocator", "sys.settrace", 1.0, "3.11", "2", "0.1"
    )
    info = replace(
        info,
        reserved_peak=2**21,
        simulation=SimulationInfo(
            gpu=GPUS["t4"].to_dict(),
            placeholders=({"filename": "t.py", "line": 3, "op": "item", "count": 2},),
            bounds=({"filename": "t.py", "line": 5, "op": "nonzero", "bound": 10, "count": 1},),
            skipped_saves=1,
            out_of_memory=oom,
        ),
        stopped=StopInfo("steady", "t.py", 2, 4, 1.5, "t.py:2"),
    )
    path = tmp_path / "meta.json"
    write_meta(path, info)
    assert read_meta(path) == info
    data = json.loads(path.read_text())
    del data["simulation"]["out_of_memory"]["request"]
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match="'simulation.out_of_memory' lacks 'request' as int"):
        read_meta(path)
    data = json.loads(path.read_text())
    data["simulation"]["out_of_memory"] = None
    data["stopped"]["iterations"] = "four"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match="'iterations'"):
        read_meta(path)
