"""The snapshot command: replayed allocated/reserved bytes, attribution to lines and phases,
the runner-style folder that compare and plot read, and the one-line errors."""

from __future__ import annotations

import csv
import gzip
import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from runfiles import line as run_line
from runfiles import runner_folder
from snapshotfiles import SETTINGS

from gpu_mem_track.allocator.rebuild import rebuild_start
from gpu_mem_track.allocator.replay import replay
from gpu_mem_track.allocator.settings import round_size, settings_from_snapshot
from gpu_mem_track.runfolder.files import read_lines
from gpu_mem_track.runs.compare import compare_files
from gpu_mem_track.runs.load import load_run
from gpu_mem_track.snapshotfile import snapshot_from_data
from gpu_mem_track.snapshotfile.records import Frame
from gpu_mem_track.snapshots.analyse import analyse
from gpu_mem_track.snapshots.attribution import PRE_TRACE, Attributor, Site

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
LARGE = 0x7F00_0000_0000
SMALL = 0x7F10_0000_0000
TORCH = "/opt/env/lib/python3.11/site-packages/torch"
CPP = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {
        "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        "filename": "",
        "line": 0,
    },
]


def py(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


def user(line: int, name: str = "main", filename: str = "/src/train.py") -> list[dict]:
    return [*CPP, py(filename, line, name)]


#: A forward pass: torch's functional, the user's module, Module._call_impl, the user's loop.
FORWARD = [
    *CPP,
    py(f"{TORCH}/nn/functional.py", 2380, "linear"),
    py("/src/model.py", 7, "forward"),
    py(f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
    py("/src/train.py", 12, "main"),
]
#: The autograd engine's thread: C++ frames only.
BACKWARD = [
    *CPP,
    {
        "name": "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
        "filename": "??",
        "line": 0,
    },
    {"name": "torch::autograd::Engine::evaluate_function(...)", "filename": "??", "line": 0},
]


def entry(action: str, addr: int, size: int, frames: list[dict], time_us: int) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us, "frames": frames}


def block(address: int, size: int, requested: int, state: str, frames: list[dict] | None = None) -> dict:
    live = state != "inactive"
    return {
        "address": address,
        "size": size,
        "requested_size": requested if live else 0,
        "state": state,
        "frames": (frames or user(3)) if live else [],
    }


def segment(address: int, blocks: list[dict], kind: str) -> dict:
    total = sum(b["size"] for b in blocks)
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
        "requested_size": sum(b["requested_size"] for b in blocks),
        "stream": 0,
        "segment_type": kind,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def training_data() -> dict:
    """A small segment with 1 MiB allocated before the trace; in the trace a 20 MiB
    segment, a 1.5 MiB request (split off), an 18 MiB + 100 B request that takes the
    remaining 18.5 MiB whole (the tail of 0.49 MiB is not cut off), its free, and a 4 B
    request from the autograd engine (a 512 B block)."""
    request = 18 * MIB + 100
    trace = [
        entry("segment_alloc", LARGE, 20 * MIB, FORWARD, 1_000_000),
        entry("alloc", LARGE, 3 * MIB // 2, user(10), 1_000_100),
        entry("alloc", LARGE + 3 * MIB // 2, request, FORWARD, 1_000_200),
        entry("free_requested", LARGE + 3 * MIB // 2, request, user(14), 1_000_300),
        entry("free_completed", LARGE + 3 * MIB // 2, request, user(14), 1_000_300),
        entry("alloc", SMALL + MIB, 4, BACKWARD, 1_500_000),
    ]
    small = segment(
        SMALL,
        [
            block(SMALL, MIB, MIB, "active_allocated"),
            block(SMALL + MIB, 512, 4, "active_allocated", BACKWARD),
            block(SMALL + MIB + 512, MIB - 512, 0, "inactive"),
        ],
        "small",
    )
    large = segment(
        LARGE,
        [
            block(LARGE, 3 * MIB // 2, 3 * MIB // 2, "active_allocated", user(10)),
            block(LARGE + 3 * MIB // 2, 37 * MIB // 2, 0, "inactive"),
        ],
        "large",
    )
    return {"segments": [small, large], "device_traces": [trace], "allocator_settings": dict(SETTINGS)}


def analysed(data: dict, include: tuple[str, ...] = ()):
    snapshot = snapshot_from_data(data, "test.pickle")
    replayed = replay(snapshot, 0)
    return analyse(snapshot, replayed, Attributor(include)), replayed


def test_peak_counts_blocks_not_requests_and_names_its_line():
    analysis, replayed = analysed(training_data())
    peak = analysis.peak
    assert peak.allocated == MIB + 3 * MIB // 2 + 37 * MIB // 2  # 21 MiB: the whole 18.5 MiB block
    assert (peak.index, peak.block, peak.request) == (2, 37 * MIB // 2, 18 * MIB + 100)
    assert peak.site == Site("/src/model.py", "forward", 7)
    assert peak.category == "forward"
    assert peak.reserved == 22 * MIB
    assert (analysis.start_allocated, analysis.start_reserved) == (MIB, 2 * MIB)
    assert analysis.final_allocated == MIB + 3 * MIB // 2 + 512
    assert (analysis.cache_at_peak, analysis.largest_free, analysis.free_blocks) == (MIB, MIB, 1)
    assert replayed.check.exact


def test_allocated_drops_at_free_requested_and_reserved_at_segment_events():
    _, replayed = analysed(training_data())
    steps = [(s.index, s.entry.action, s.bytes, s.allocated, s.reserved) for s in replayed.steps]
    assert steps == [
        (0, "segment_alloc", 20 * MIB, MIB, 22 * MIB),
        (1, "alloc", 3 * MIB // 2, 5 * MIB // 2, 22 * MIB),
        (2, "alloc", 37 * MIB // 2, 21 * MIB, 22 * MIB),
        (3, "free_requested", -37 * MIB // 2, 5 * MIB // 2, 22 * MIB),
        (5, "alloc", 512, 5 * MIB // 2 + 512, 22 * MIB),
    ]


def test_lines_phases_and_the_row_before_recording():
    analysis, _ = analysed(training_data())
    rows = {u.site: u for u in analysis.lines}
    model, loop, freer = (
        Site("/src/model.py", "forward", 7),
        Site("/src/train.py", "main", 10),
        Site("/src/train.py", "main", 14),
    )
    node = Site("<backward>", "MmBackward0", 0)
    assert (rows[model].allocated, rows[model].live_at_peak, rows[model].live_at_end) == (
        37 * MIB // 2,
        37 * MIB // 2,
        0,
    )
    assert (rows[loop].hits, rows[loop].live_at_peak, rows[loop].category) == (1, 3 * MIB // 2, "other")
    assert (rows[freer].hits, rows[freer].freed) == (0, 37 * MIB // 2)
    assert (rows[node].allocated, rows[node].live_at_peak, rows[node].category) == (512, 0, "backward")
    assert (rows[PRE_TRACE].allocated, rows[PRE_TRACE].live_at_peak, rows[PRE_TRACE].hits) == (MIB, MIB, 1)
    phases = {c.name: (c.hits, c.allocated, c.live_at_peak) for c in analysis.categories}
    assert phases == {
        "forward": (1, 37 * MIB // 2, 37 * MIB // 2),
        "other": (1, 3 * MIB // 2, 3 * MIB // 2),
        "backward": (1, 512, 0),
        "before recording": (1, MIB, MIB),
    }
    # Increments (allocated minus freed, the pre-trace row's bytes included) add up to the end.
    assert sum(u.allocated - u.freed for u in analysis.lines) == analysis.final_allocated


def pre_trace_data(gap: int, pin: bool) -> dict:
    """A 40 MiB segment from before the trace: a 5 MiB request at its start, freed in the
    trace, and a block in use from 5 MiB + ``gap`` on; with ``pin``, a 2 MiB allocation
    lands right after the first block's tail before it is freed."""
    p_size = 5 * MIB + (gap if gap <= MIB else MIB // 2 if pin else 0)
    q_at = 5 * MIB + gap
    trace = []
    blocks = []
    if pin:
        trace.append(entry("alloc", LARGE + p_size, 2 * MIB, user(20), 10))
    trace += [
        entry("free_requested", LARGE, 5 * MIB, user(21), 20),
        entry("free_completed", LARGE, 5 * MIB, user(21), 20),
    ]
    if pin:
        blocks += [
            block(LARGE, p_size, 0, "inactive"),
            block(LARGE + p_size, 2 * MIB, 2 * MIB, "active_allocated", user(20)),
            block(LARGE + p_size + 2 * MIB, q_at - p_size - 2 * MIB, 0, "inactive"),
        ]
    else:
        blocks.append(block(LARGE, q_at, 0, "inactive"))
    blocks.append(block(LARGE + q_at, 40 * MIB - q_at, 40 * MIB - q_at, "active_allocated"))
    return {
        "segments": [segment(LARGE, blocks, "large")],
        "device_traces": [trace],
        "allocator_settings": SETTINGS,
    }


def test_tail_of_a_block_from_before_the_trace_up_to_1_mib_is_counted():
    analysis, replayed = analysed(pre_trace_data(gap=MIB, pin=False))
    assert analysis.start_allocated == 40 * MIB  # the 5 MiB request held a 6 MiB block
    assert replayed.check.exact


def test_longer_gap_is_pinned_by_an_allocation_or_reported_unresolved():
    analysis, replayed = analysed(pre_trace_data(gap=5 * MIB, pin=True))
    assert analysis.start_allocated == 5 * MIB + MIB // 2 + 30 * MIB  # the tail pinned at 0.5 MiB
    assert replayed.check.exact
    analysis, replayed = analysed(pre_trace_data(gap=5 * MIB, pin=False))
    assert analysis.start_allocated == 5 * MIB + 30 * MIB  # the tail unknown, counted as none
    assert (replayed.check.unresolved_tails, replayed.check.tail_bytes) == (1, MIB)
    assert not replayed.check.exact


@pytest.mark.parametrize(
    ("gap", "pin", "how"), [(MIB, False, "seen"), (5 * MIB, True, "seen"), (5 * MIB, False, "assumed")]
)
def test_the_replay_starts_from_the_allocator_models_one_rebuild(gap, pin, how):
    """The report's replay and the allocator check share one start state: the blocks in
    use at the trace's start, sizes and tails, are ``allocator.rebuild``'s."""
    snapshot = snapshot_from_data(pre_trace_data(gap=gap, pin=pin), "test.pickle")
    settings = settings_from_snapshot(snapshot.allocator_settings)
    start = rebuild_start(snapshot.device_segments(0), snapshot.device_trace(0), settings)
    rebuilt = {b.address: b.size for s in start.segments for b in s.blocks if b.state == "active_allocated"}
    assert dict(replay(snapshot, 0).start_blocks) == rebuilt
    assert [tail.how for tail in start.tails] == [how]


def test_rounding_read_from_the_snapshot_settings_follows_torch_oracles():
    size = 21 * 2**20 * 4  # torch.rand(21 * 2**20): 88,080,384 B
    assert round_size(size, settings_from_snapshot(SETTINGS)) == 88_080_384
    assert round_size(4, settings_from_snapshot(SETTINGS)) == 512
    four = {"roundup_power2_divisions": {str(2**i): 4 for i in range(16)}}
    assert round_size(size, settings_from_snapshot(four)) == 100_663_296
    table = {"roundup_power2_divisions": {**{str(2**i): 0 for i in range(16)}, "64": 8, "128": 2}}
    assert round_size(size, settings_from_snapshot(table)) == 92_274_688


def test_power2_divisions_in_the_snapshot_change_the_replayed_blocks():
    data = training_data()
    data["device_traces"] = [[entry("alloc", SMALL + MIB, 600 * 1024 + 1, user(10), 1)]]
    data["allocator_settings"] = {"roundup_power2_divisions": {str(2**i): 4 for i in range(16)}}
    small = data["segments"][0]
    small["blocks"][1:] = [
        block(SMALL + MIB, 640 * 1024, 600 * 1024 + 1, "active_allocated", user(10)),
        block(SMALL + MIB + 640 * 1024, 384 * 1024, 0, "inactive"),
    ]
    _, replayed = analysed(data)
    # 600 KiB + 1 B lies between 512 KiB and 1 MiB: four divisions of 128 KiB, so 640 KiB
    assert replayed.steps[0].bytes == 640 * 1024
    assert replayed.check.blocks_matching == replayed.check.blocks_checked == 1


def frames(*items: tuple[str, int, str]) -> tuple[Frame, ...]:
    return tuple(Frame(f, n, m) for f, n, m in items)


def test_attribution_skips_libraries_and_include_adds_them():
    stack = frames(
        ("??", 0, "at::empty"),
        ("/usr/lib/python3.11/copy.py", 128, "deepcopy"),
        ("/env/lib/python3.11/site-packages/transformers/models/gpt2.py", 300, "forward"),
        ("/src/app.py", 5, "main"),
    )
    assert Attributor().site(stack) == Site("/src/app.py", "main", 5)
    included = Attributor(["transformers.models", "nothing_like_this"])
    assert included.site(stack) == Site(
        "/env/lib/python3.11/site-packages/transformers/models/gpt2.py", "forward", 300
    )
    assert included.unmatched() == ("nothing_like_this",)
    assert Attributor().site(frames(("??", 0, "cudaMalloc"))).file == "<no Python frame>"
    assert Attributor().site(()).file == "<no frames>"
    assert Attributor().site(frames((f"{TORCH}/optim/adam.py", 90, "step"))).file == f"{TORCH}/optim/adam.py"


@pytest.mark.parametrize(
    ("stack", "category"),
    [
        (
            frames((f"{TORCH}/optim/adamw.py", 90, "_single_tensor_adamw"), ("/src/train.py", 30, "main")),
            "optimizer",
        ),
        (frames((f"{TORCH}/_tensor.py", 626, "backward"), ("/src/train.py", 29, "main")), "backward"),
        (frames(("??", 0, "torch::autograd::Engine::thread_main(...)")), "backward"),
        (
            frames(("/src/m.py", 3, "forward"), (f"{TORCH}/nn/modules/module.py", 1750, "_call_impl")),
            "forward",
        ),
        (frames(("/src/train.py", 12, "main")), "other"),
    ],
)
def test_categories_from_frames(stack, category):
    assert Attributor().describe(stack)[1] == category


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + str(ROOT / "tests")}
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def write(path: Path, data: dict) -> Path:
    path.write_bytes(gzip.compress(pickle.dumps(data)))
    return path


def test_cli_writes_a_runner_folder_that_compare_and_load_read(tmp_path):
    source = write(tmp_path / "step.pickle.gz", training_data())
    done = cli("snapshot", str(source), "--out-dir", str(tmp_path / "reports"))
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "reports" / "step"
    assert "peak allocated 21.00 MiB at +0.000 s by /src/model.py:7 forward" in done.stdout
    names = {"report.txt", "lines.csv", "timeline.csv", "meta.json", "snapshot.json", "snapshot_lines.csv"}
    assert names <= {p.name for p in folder.iterdir()}
    records = read_lines(folder / "lines.csv")
    assert sum(r.increment for r in records) == MIB + 3 * MIB // 2 + 512
    run = load_run(folder)
    assert (run.peak, run.memory_source, run.device) == (21 * MIB, "cuda allocator", "cuda:0")
    assert max(s.memory for s in run.samples) == 21 * MIB
    assert max(s.reserved for s in run.samples if s.reserved is not None) == 22 * MIB
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["peak_at"] == "/src/model.py:7" and meta["engine"] == "memory snapshot"
    summary = json.loads((folder / "snapshot.json").read_text())
    assert summary["check"]["exact"] is True and summary["peak"]["category"] == "forward"
    report = (folder / "report.txt").read_text()
    assert "final allocated replayed 2.50 MiB = recorded 2.50 MiB" in report


def test_compare_snapshot_with_snapshot_and_with_a_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("\n".join(f"x{i} = {i}" for i in range(1, 30)) + "\n")
    data = training_data()
    for e in data["device_traces"][0]:
        e["frames"] = [
            dict(f, filename=str(script)) if f["filename"] == "/src/train.py" else f for f in e["frames"]
        ]
    first = write(tmp_path / "a.pickle", data)
    assert (
        cli("snapshot", str(first), str(first), "--out-dir", str(tmp_path / "r"), "--name", "s").returncode
        == 0
    )
    same = compare_files(tmp_path / "r" / "s", tmp_path / "r" / "s-2")
    assert same.rows and all(row.a is not None and row.b is not None for row in same.rows)
    record = replace(run_line("x10 = 10", 10, 2, 3, function="main"), file=str(script))
    run = runner_folder(tmp_path, "run", [record], peak=3 * MIB)
    mixed = compare_files(tmp_path / "r" / "s", run)
    matched = [row for row in mixed.rows if row.a is not None and row.b is not None]
    assert [row.key for row in matched] == [("train.py", "main", "x10 = 10")]


def test_plot_draws_a_snapshot_folder(tmp_path):
    pytest.importorskip("matplotlib")
    from gpu_mem_track.runs.plot import plot_files

    source = write(tmp_path / "step.pickle.gz", training_data())
    assert cli("snapshot", str(source), "--out-dir", str(tmp_path)).returncode == 0
    plotted = plot_files([tmp_path / "step"], tmp_path / "t.png")
    assert plotted.path == tmp_path / "t.png" and plotted.path.stat().st_size > 0 and plotted.notes == ()


def test_snapshot_without_trace_reports_live_blocks_per_line(tmp_path):
    data = training_data()
    data["device_traces"] = [[]]
    source = write(tmp_path / "end.pickle", data)
    done = cli("snapshot", str(source), "--out-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    records = {(r.file, r.line): r for r in read_lines(tmp_path / "end" / "lines.csv")}
    assert records[("/src/train.py", 10)].increment == 3 * MIB // 2
    assert records[("<backward>", 0)].increment == 512
    assert not any(r.peak_exact for r in records.values())
    with (tmp_path / "end" / "timeline.csv").open() as handle:
        assert [row["event"] for row in csv.DictReader(handle)] == ["start", "end"]
    report = (tmp_path / "end" / "report.txt").read_text()
    assert "trace: none recorded" in report
    assert "segments when the snapshot was taken: 2 (1 small, 1 large)" in report
    assert "reserved then 22.00 MiB; cache (reserved - allocated) 19.50 MiB" in report


def test_device_option_names_a_device_of_the_snapshot(tmp_path):
    source = write(tmp_path / "step.pickle", training_data())
    done = cli("snapshot", str(source), "--device", "3", "--out-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr == f"gpu_mem_track: {source}: no device 3 in the snapshot (devices: 0)\n"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.pickle", "no such snapshot"),
        (lambda p: p, "a directory, not a memory snapshot"),
        (lambda p: (p / "notes.txt").write_text("hello") and p / "notes.txt", "not a pickle"),
        (lambda p: (p / "evil.pickle").write_bytes(pickle.dumps(print)) and p / "evil.pickle", "refused"),
        (
            lambda p: (p / "list.pickle").write_bytes(pickle.dumps({"x": 1})) and p / "list.pickle",
            "no 'segments'",
        ),
    ],
)
def test_bad_files_one_line_exit_2_nothing_written(tmp_path, make, message):
    target = make(tmp_path)
    done = cli("snapshot", str(target), "--out-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.startswith("gpu_mem_track: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "out").exists()


def test_replay_agrees_with_the_allocator_model_after_every_call():
    """A random workload through the project's allocator model, its log as the trace with
    the oldest third dropped (a ring buffer): after every call the replayed allocated bytes
    equal the model's, or are low by no more than the unknown tails of blocks from before
    the trace still counted then; the peak's bound covers the true peak."""
    import random

    from gpu_mem_track.allocator import Allocator

    rng = random.Random(7)
    allocator, log, truth, live = Allocator(), [], [], []
    for _ in range(600):
        first = len(allocator.events)
        if live and rng.random() < 0.45:
            allocator.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice((rng.randrange(1, MIB), rng.randrange(MIB, 30 * MIB)))
            live.append(allocator.malloc(size))
        for e in allocator.events[first:]:
            log.append(entry(e.action, e.address, e.size, user(len(log) % 50 + 1), len(log) + 1))
        truth.append((len(log), allocator.allocated))
    cut = truth[len(truth) // 3][0]
    segments = [s.to_dict() for s in allocator.segments()]
    data = {"segments": segments, "device_traces": [log[cut:]], "allocator_settings": SETTINGS}
    analysis, replayed = analysed(data)
    at_entry, value, steps = [], replayed.start_allocated, iter(replayed.steps)
    step = next(steps, None)
    for index in range(len(log) - cut):  # allocated bytes after each entry of the trace
        while step is not None and step.index == index:
            value, step = step.allocated, next(steps, None)
        at_entry.append(value)
    compared = exact = 0
    for length, allocated in truth[len(truth) // 3 + 1 :]:
        index = length - cut - 1
        low_by = allocated - at_entry[index]
        assert 0 <= low_by <= replayed.uncertainty(index), length
        compared += 1
        exact += low_by == 0
    assert compared == 399 and exact > 0.9 * compared
    assert replayed.check.unresolved_tails == len(replayed.tails) > 0  # this seed has some
    true_peak = max(a for length, a in truth[len(truth) // 3 :])
    assert analysis.peak.allocated <= true_peak <= analysis.peak.bound
    assert replayed.check.segments_matching == replayed.check.segments
    assert replayed.check.final_allocated_replayed == allocator.allocated


def test_the_command_imports_no_torch(tmp_path):
    source = write(tmp_path / "step.pickle.gz", training_data())
    code = (
        "import sys\n"
        "from gpu_mem_track.cli import main\n"
        f"assert main(['snapshot', {str(source)!r}, '--out-dir', {str(tmp_path)!r}]) == 0\n"
        "print(sorted(m for m in ('torch', 'matplotlib.pyplot') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


CACHE_STACK = [*CPP, py(f"{TORCH}/cuda/memory.py", 222, "empty_cache"), py("/src/train.py", 30, "main")]


def expandable_data() -> dict:
    """An expandable segment (``expandable_segments:True``): 20 MiB mapped before the
    trace holding an 8 MiB block; the trace maps 20 MiB more for a 25 MiB block that
    crosses into it, frees both, ``empty_cache()`` unmaps all 40 MiB, then 20 MiB are
    mapped again for a 1 MiB + 1 B request (a block of 1 MiB + 512 B: blocks are cut
    to the rounded request in expandable segments), and 20 MiB more for 25 MiB."""
    request = MIB + 1
    trace = [
        entry("segment_map", LARGE + 20 * MIB, 20 * MIB, user(10), 1),
        entry("alloc", LARGE + 8 * MIB, 25 * MIB, user(10), 2),
        entry("free_requested", LARGE, 8 * MIB, user(11), 3),
        entry("free_completed", LARGE, 8 * MIB, user(11), 3),
        entry("free_requested", LARGE + 8 * MIB, 25 * MIB, user(12), 4),
        entry("free_completed", LARGE + 8 * MIB, 25 * MIB, user(12), 4),
        entry("segment_unmap", LARGE, 40 * MIB, CACHE_STACK, 5),
        entry("segment_map", LARGE, 20 * MIB, user(13), 6),
        entry("alloc", LARGE, request, user(13), 6),
        entry("segment_map", LARGE + 20 * MIB, 20 * MIB, user(14), 7),
        entry("alloc", LARGE + MIB + 512, 25 * MIB, user(14), 7),
    ]
    blocks = [
        block(LARGE, MIB + 512, request, "active_allocated", user(13)),
        block(LARGE + MIB + 512, 25 * MIB, 25 * MIB, "active_allocated", user(14)),
        block(LARGE + 26 * MIB + 512, 14 * MIB - 512, 0, "inactive"),
    ]
    mapped = dict(segment(LARGE, blocks, "large"), is_expandable=True)
    settings = dict(SETTINGS, expandable_segments=True)
    return {"segments": [mapped], "device_traces": [trace], "allocator_settings": settings}


def test_expandable_segments_are_replayed_by_the_same_model():
    """Mapped and unmapped pages count in reserved bytes, blocks are the rounded
    requests, the start state has only the range mapped then, and the figures end at
    the recorded ones; the model's own placement is not followed (approximate)."""
    analysis, replayed = analysed(expandable_data())
    steps = [(s.index, s.bytes, s.allocated, s.reserved) for s in replayed.steps]
    assert (replayed.start_allocated, replayed.start_reserved) == (8 * MIB, 20 * MIB)
    assert steps == [
        (0, 20 * MIB, 8 * MIB, 40 * MIB),
        (1, 25 * MIB, 33 * MIB, 40 * MIB),
        (2, -8 * MIB, 25 * MIB, 40 * MIB),
        (4, -25 * MIB, 0, 40 * MIB),
        (6, -40 * MIB, 0, 0),
        (7, 20 * MIB, 0, 20 * MIB),
        (8, MIB + 512, MIB + 512, 20 * MIB),
        (9, 20 * MIB, MIB + 512, 40 * MIB),
        (10, 25 * MIB, 26 * MIB + 512, 40 * MIB),
    ]
    check = replayed.check
    assert check.approximate and not check.misfits and not check.unresolved_tails
    final = (26 * MIB + 512, 40 * MIB)
    assert (check.final_allocated_replayed, check.final_reserved_replayed) == final
    assert (check.final_allocated_recorded, check.final_reserved_recorded) == final
    assert (analysis.peak.allocated, analysis.peak.index) == (33 * MIB, 1)
    assert analysis.empty_cache == ((5, 40 * MIB, 1),)
    assert replayed.report.unsupported_events == 4
