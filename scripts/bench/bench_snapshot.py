"""Benchmark: load and analyse a memory snapshot of the size users bring (about 3 MB of
pickle, 20,000 trace entries), as ``gpu-mem-track snapshot`` does.

The snapshot is built here, synthetically but in torch's exact shape: a training-like
workload (weights allocated before recording, then forward activations, backward
gradients and temporaries, optimizer states and updates, an ``empty_cache()``) runs
through the project's caching-allocator model (``gpu_mem_track.allocator``), whose log
becomes the trace and whose cache becomes the segments. Every entry carries a stack
like the recorded ones: 15-30 C++ frames (allocator, dispatcher, kernels, autograd
engine) mixed with Python frames (user code, ``torch/nn/modules/module.py``,
``torch/optim``), stacks and frames shared between entries as torch pickles them. The
oldest entries are dropped, as the ring buffer does, so memory is live before the trace.

Times: loading (unpickle and records), the analysis (the allocator model's replay, attribution)
and writing the folder, medians of ``--repeat`` runs in this process, plus the whole
command in a fresh process. Writes reports/bench_snapshot.md and .json.

    python scripts/bench/bench_snapshot.py [--entries 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_mem_track.allocator import Allocator  # noqa: E402
from gpu_mem_track.allocator.replay import replay  # noqa: E402
from gpu_mem_track.outputs import claim_folder  # noqa: E402
from gpu_mem_track.runfolder.files import RunFolder  # noqa: E402
from gpu_mem_track.snapshotfile import load_snapshot  # noqa: E402
from gpu_mem_track.snapshots.analyse import analyse  # noqa: E402
from gpu_mem_track.snapshots.attribution import Attributor  # noqa: E402
from gpu_mem_track.snapshots.folder import write_folder  # noqa: E402

MIB = 2**20
TORCH = "/home/user/.venv/lib/python3.11/site-packages/torch"
USER_FILES = ("/home/user/proj/model.py", "/home/user/proj/layers.py", "/home/user/proj/train.py")
OPS = ("mm", "addmm", "bmm", "add", "mul", "div", "gelu", "softmax", "layer_norm", "index", "cat", "sum")


class Stacks:
    """Frame dicts and stacks shared between entries, as torch's pickles share them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.frames: dict[tuple, dict] = {}
        self.stacks: dict[tuple, list] = {}

    def frame(self, filename: str, line: int, name: str) -> dict:
        key = (filename, line, name)
        if key not in self.frames:
            self.frames[key] = {"name": name, "filename": filename, "line": line}
        return self.frames[key]

    def cpp(self, op: str, depth: int) -> list[dict]:
        head = [
            self.frame("??", 0, "torch::unwind::unwind()"),
            self.frame("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
            self.frame("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::"
                       "DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
        ]  # fmt: skip
        body = [
            self.frame("RegisterCUDA.cpp", 0, f"at::(anonymous namespace)::wrapper_CUDA_{op}_{i}("
                       "at::Tensor const&, c10::ArrayRef<long>, std::optional<c10::ScalarType>)")
            for i in range(depth)
        ]  # fmt: skip
        return head + body

    def stack(self, phase: str, site: int) -> list[dict]:
        key = (phase, site)
        if key not in self.stacks:
            self.stacks[key] = self.cpp(OPS[site % len(OPS)], 18 + site % 30) + self.python(phase, site)
        return self.stacks[key]

    def python(self, phase: str, site: int) -> list[dict]:
        """The Python part of a stack, with the interpreter's C frames between."""
        if phase == "backward":
            node = f"torch::autograd::generated::{OPS[site % len(OPS)].title()}Backward{site % 3}::apply("
            return [
                self.frame("??", 0, node + "std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
                self.frame("??", 0, "torch::autograd::Node::operator()(std::vector<at::Tensor>&&)"),
                self.frame("??", 0, "torch::autograd::Engine::evaluate_function(...)"),
                self.frame("??", 0, "torch::autograd::Engine::thread_main(...)"),
                self.frame("thread48.o", 0, "execute_native_thread_routine"),
            ]
        eval_frame = self.frame("??", 0, "_PyEval_EvalFrameDefault")
        frames = [self.frame(USER_FILES[site % 2], 20 + site % 240, "forward"), eval_frame]
        for depth in range(site % 4):
            frames += [self.frame(f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"), eval_frame]
            frames += [self.frame(USER_FILES[depth % 2], 300 + (site // 7) % 40, "forward"), eval_frame]
        if phase == "optimizer":
            frames += [self.frame(f"{TORCH}/optim/optimizer.py", 493, "wrapper"), eval_frame]
        frames.append(self.frame(USER_FILES[2], 40 + site % 9, "main"))
        return frames


def build(entries: int, seed: int = 0) -> tuple[dict, int]:
    """A snapshot dict whose device trace holds about ``entries`` entries (cut where a
    call starts; see the docstring), and the model's allocated bytes at the trace's start."""
    rng = random.Random(seed)
    allocator, stacks = Allocator(), Stacks(rng)
    log: list[dict] = []
    where: dict[int, list] = {}
    allocated_at: dict[int, int] = {0: 0}  # log length after a call -> allocated bytes then

    def malloc(size: int, phase: str, site: int) -> int:
        first = len(allocator.events)
        address = allocator.malloc(size)
        frames = stacks.stack(phase, site)
        where[address] = frames
        log.extend(_entries(allocator.events[first:], frames, len(log)))
        allocated_at[len(log)] = allocator.allocated
        return address

    def free(address: int, phase: str, site: int) -> None:
        first = len(allocator.events)
        allocator.free(address)
        log.extend(_entries(allocator.events[first:], stacks.stack(phase, site), len(log)))
        allocated_at[len(log)] = allocator.allocated

    weights = [
        malloc(rng.choice((4, 16, 64)) * MIB + rng.randrange(0, 4096), "forward", i) for i in range(300)
    ]
    dropped = len(log)
    while len(log) - dropped < entries:
        _step(rng, malloc, free, weights)
        first = len(allocator.events)
        allocator.empty_cache()
        log.extend(_entries(allocator.events[first:], stacks.stack("optimizer", 7), len(log)))
    cut = min(at for at in allocated_at if at >= len(log) - entries)
    trace = log[cut:]
    segments = [_segment_dict(s, where) for s in allocator.segments()]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False,
                "roundup_power2_divisions": {str(2**i): 0 for i in range(16)}}  # fmt: skip
    return {"segments": segments, "device_traces": [trace], "allocator_settings": settings}, allocated_at[cut]


def _step(rng: random.Random, malloc, free, weights: list[int]) -> None:  # noqa: ANN001
    """One training step: activations, backward (gradients kept), optimizer temporaries."""
    sizes = [rng.choice((rng.randrange(512, MIB), rng.randrange(2 * MIB, 40 * MIB))) for _ in range(400)]
    saved = [malloc(size, "forward", rng.randrange(30000)) for size in sizes]
    grads = []
    for index in reversed(range(len(saved))):
        temp = malloc(rng.randrange(512, 8 * MIB), "backward", rng.randrange(15000))
        if index % 4 == 0:
            grads.append(malloc(rng.randrange(MIB, 16 * MIB), "backward", rng.randrange(15000)))
        free(temp, "backward", rng.randrange(15000))
        free(saved[index], "backward", rng.randrange(15000))
    for grad in grads:
        temp = malloc(rng.randrange(MIB, 16 * MIB), "optimizer", rng.randrange(4000))
        free(temp, "optimizer", rng.randrange(4000))
        free(grad, "optimizer", rng.randrange(4000))


def _entries(events, frames: list, at: int) -> list[dict]:  # noqa: ANN001
    return [
        {"action": e.action, "addr": e.address, "size": e.size, "stream": e.stream,
         "time_us": 1_700_000_000_000_000 + 20 * (at + i), "frames": frames}
        for i, e in enumerate(events)
    ]  # fmt: skip


def _segment_dict(segment, where: dict[int, list]) -> dict:  # noqa: ANN001
    data = segment.to_dict()
    for block in data["blocks"]:
        block["frames"] = where.get(block["address"], []) if block["state"] != "inactive" else []
    return data


def _analyse(path: Path, out: Path) -> tuple[dict[str, float], object]:
    clocks = [(time.perf_counter(), time.process_time())]
    snapshot = load_snapshot(path)
    clocks.append((time.perf_counter(), time.process_time()))
    attributor = Attributor()
    replayed = replay(snapshot, 0)
    analysis = analyse(snapshot, replayed, attributor)
    clocks.append((time.perf_counter(), time.process_time()))
    write_folder(RunFolder(claim_folder(out, "bench")), analysis, replayed, attributor)
    clocks.append((time.perf_counter(), time.process_time()))
    check = replayed.check
    assert check.segments_matching == check.segments and not check.misfits, check
    assert check.final_allocated_replayed == check.final_allocated_recorded, check
    assert replayed.report.all_match, replayed.report.mismatches[:3]
    timings = {}
    for step, (before, after) in zip(("load", "analyse", "write"), zip(clocks, clocks[1:])):
        timings[step] = after[0] - before[0]
        timings[f"{step}_cpu"] = after[1] - before[1]
    return timings, replayed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench_snapshot.md")
    parser.add_argument(
        "--recorded", type=Path, help="a recorded snapshot to time too (default: the fixture)"
    )
    args = parser.parse_args(argv)
    data, truth = build(args.entries)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.pickle"
        path.write_bytes(pickle.dumps(data, protocol=4))
        measured = [_analyse(path, Path(tmp) / "reports") for _ in range(args.repeat)]
        runs, replayed = [m[0] for m in measured], measured[-1][1]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpu_mem_track", "snapshot", str(path), "--out-dir",
                               str(Path(tmp) / "cli")], capture_output=True, text=True, env=env)  # fmt: skip
        command = time.perf_counter() - started
        assert done.returncode == 0, done.stderr
        result = _result(data, path.stat().st_size, runs, command)
        check = replayed.check
        result.update(
            start_allocated_replayed=replayed.start_allocated,
            start_allocated_model=truth,
            unresolved_tails=check.unresolved_tails,
            tail_bytes=check.tail_bytes,
            segments_matching=f"{check.segments_matching}/{check.segments}",
            decisions=replayed.report.allocs.recorded
            + replayed.report.segment_allocs.recorded
            + replayed.report.segment_frees.recorded,
        )
        recorded = _recorded(args.recorded, args.repeat, Path(tmp) / "recorded")
    result["recorded"] = recorded
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    text = _markdown(result) + (_recorded_markdown(recorded) if recorded else "")
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


def _recorded(path: Path | None, repeat: int, out: Path) -> dict | None:
    """The same timings on a recorded snapshot (the training-step fixture when present)."""
    if path is None:
        found = [ROOT.parent / "shared", ROOT.parent.parent / "shared"]
        name = "fixtures/snapshots/transformer-2.7b-ctx128-train-step.pickle.gz"
        path = next((p / name for p in found if (p / name).is_file()), None)
    if path is None:
        return None
    runs = [_analyse(path, out)[0] for _ in range(repeat)]
    raw = path.read_bytes()
    trace = load_snapshot(path).device_traces[0]
    return {
        "file": path.name,
        "file_bytes": len(raw),
        "pickle_bytes": len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw),
        "entries": len(trace),
        "frames_per_entry": sum(len(e.frames) for e in trace) / max(len(trace), 1),
        "median_seconds": {key: statistics.median(r[key] for r in runs) for key in runs[0]},
    }


def _recorded_markdown(recorded: dict) -> str:
    m = recorded["median_seconds"]
    return (
        f"\nThe recorded snapshot `{recorded['file']}` ({recorded['file_bytes'] / 1e3:.0f} kB on disk, "
        f"{recorded['pickle_bytes'] / 1e6:.2f} MB of pickle, {recorded['entries']:,} entries, "
        f"{recorded['frames_per_entry']:.1f} frames per entry), the same way: load "
        f"{m['load']:.3f} s wall / {m['load_cpu']:.3f} s CPU, analyse {m['analyse']:.3f} / "
        f"{m['analyse_cpu']:.3f}, load + analyse {m['load'] + m['analyse']:.3f} / "
        f"{m['load_cpu'] + m['analyse_cpu']:.3f}.\n"
    )


def _result(data: dict, size: int, runs: list[dict[str, float]], command: float) -> dict:
    trace = data["device_traces"][0]
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return {
        "file_bytes": size,
        "entries": len(trace),
        "segments": len(data["segments"]),
        "distinct_stacks": len({id(e["frames"]) for e in trace}),
        "frames_per_entry": sum(len(e["frames"]) for e in trace) / len(trace),
        "repeat": len(runs),
        "median_seconds": medians,
        "median_load_and_analyse": statistics.median(r["load"] + r["analyse"] for r in runs),
        "median_load_and_analyse_cpu": statistics.median(r["load_cpu"] + r["analyse_cpu"] for r in runs),
        "command_seconds": command,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "runs": runs,
    }


def _markdown(result: dict) -> str:
    m = result["median_seconds"]
    return (
        "# Snapshot analysis speed\n\n"
        "`python scripts/bench/bench_snapshot.py` (synthetic snapshot built through the allocator model; "
        f"Python {result['python']}, {result['cpus']} CPU cores shared with other work, load average "
        f"{result['load_average']:.1f} at the end; medians of {result['repeat']} runs in one process; "
        "CPU seconds are this process's, wall seconds include waiting for a core).\n\n"
        f"Snapshot: {result['file_bytes'] / 1e6:.2f} MB of pickle, {result['entries']:,} trace entries, "
        f"{result['segments']} segments, {result['distinct_stacks']:,} distinct stacks, "
        f"{result['frames_per_entry']:.1f} frames per entry.\n\n"
        "| step | wall seconds | CPU seconds |\n|---|---|---|\n"
        f"| load (unpickle, records) | {m['load']:.3f} | {m['load_cpu']:.3f} |\n"
        "| analyse (the allocator model's replay, attribution) | "
        f"{m['analyse']:.3f} | {m['analyse_cpu']:.3f} |\n"
        f"| **load + analyse** | **{result['median_load_and_analyse']:.3f}** | "
        f"**{result['median_load_and_analyse_cpu']:.3f}** |\n"
        f"| write the folder (report, CSVs, JSON) | {m['write']:.3f} | {m['write_cpu']:.3f} |\n"
        "| whole command in a fresh process (interpreter start included) | "
        f"{result['command_seconds']:.3f} | |\n\n"
        "Target: under 2 s for load + analysis.\n\n"
        f"Replay: blocks in use reproduced in {result['segments_matching']} segments, final allocated "
        f"and reserved equal to the segments', the model making all {result['decisions']:,} recorded "
        "decisions (block addresses, segment allocations and releases) (asserted). Allocated at the "
        "trace's start: replayed "
        f"{result['start_allocated_replayed']:,} B, the model's own figure "
        f"{result['start_allocated_model']:,} B. "
        f"{result['unresolved_tails']} blocks from before the trace were freed in it with a tail no later "
        f"allocation pinned (assumed none; at most {result['tail_bytes']:,} B in all).\n"
    )


if __name__ == "__main__":
    sys.exit(main())
