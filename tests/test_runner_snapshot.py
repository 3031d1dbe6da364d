"""``run --snapshot`` without a GPU: a fake device whose allocator is the simulated caching
allocator (``gpu_mem_track.allocator``), read through the real ``CudaSampler`` as torch's
``_cuda_memoryStats`` returns it, and whose history recorder writes snapshots in torch's
shape, stacks taken from the running script as ``stacks="python"`` records them."""

from __future__ import annotations

import csv
import inspect
import pickle
import sys
import types
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from snapshotfiles import SETTINGS

from gpu_mem_track.allocator import Allocator
from gpu_mem_track.devices import Device
from gpu_mem_track.runfolder.files import read_lines
from gpu_mem_track.runfolder.records import LineRecord
from gpu_mem_track.runner.history import LineWindows, TorchHistory, history_calls
from gpu_mem_track.runner.options import RunOptions
from gpu_mem_track.runner.peaks import innermost_lines, merge_peaks, window_peaks
from gpu_mem_track.runner.run import execute, prepare
from gpu_mem_track.runner.samplers import CudaSampler
from gpu_mem_track.snapshotfile import load_snapshot

MIB = 2**20


class FakeGpu:
    """One CUDA device for the runner: ``alloc``/``free`` for the script, ``stats`` as
    ``torch._C._cuda_memoryStats(device)`` returns it, and the ``HistoryRecorder`` calls."""

    note = ""

    def __init__(self) -> None:
        self.allocator = Allocator()
        self.trace: deque[dict[str, Any]] | None = None
        self.clock_us = 1_700_000_000_000_000
        self.started_with: int | None = None

    # -- the script's allocations ------------------------------------------------------

    def alloc(self, nbytes: int, stack: bool = True) -> int:
        seen = len(self.allocator.events)
        address = self.allocator.malloc(nbytes)
        self._record(seen, stack)
        return address

    def free(self, address: int, stack: bool = True) -> None:
        seen = len(self.allocator.events)
        self.allocator.free(address)
        self._record(seen, stack)

    def spike(self, nbytes: int) -> None:
        """A call that allocates and frees inside itself (a temporary)."""
        self.free(self.alloc(nbytes))

    def _record(self, seen: int, stack: bool) -> None:
        if self.trace is None:
            return
        frames = _python_stack(sys._getframe(1)) if stack else []
        for event in self.allocator.events[seen:]:
            self.clock_us += 3
            self.trace.append(
                {
                    "action": event.action,
                    "addr": event.address,
                    "size": event.size,
                    "stream": event.stream,
                    "time_us": self.clock_us,
                    "frames": frames,
                }
            )

    # -- torch._C._cuda_memoryStats -----------------------------------------------------

    def stats(self, device: int) -> dict[str, Any]:
        assert device == 0
        return {
            name: {
                pool: {k: getattr(stat, k) for k in ("current", "peak", "allocated", "freed")}
                for pool, stat in pools.items()
            }
            for name, pools in self.allocator.stats.families.items()
        }

    # -- HistoryRecorder -----------------------------------------------------------------

    def start(self, max_entries: int) -> None:
        self.started_with = max_entries
        self.trace = deque(maxlen=max_entries)

    def dump(self, path: Path) -> bool:
        if self.trace is None:
            return False
        snapshot = {
            "segments": [segment.to_dict() for segment in self.allocator.segments()],
            "device_traces": [list(self.trace)],
            "allocator_settings": dict(SETTINGS),
            "external_annotations": [],
        }
        path.write_bytes(pickle.dumps(snapshot))
        return True

    def stop(self) -> None:
        self.trace = None


def _python_stack(frame: Any) -> list[dict[str, Any]]:
    """The Python frames from ``frame`` outwards, innermost first, as torch records them,
    without the fake's own (torch's frames would be library code)."""
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    out = []
    while frame is not None:
        out.append(
            {"filename": frame.f_code.co_filename, "line": frame.f_lineno, "name": frame.f_code.co_name}
        )
        frame = frame.f_back
    return out


SCRIPT = """\
import fakegpu
MIB = 2 ** 20
weights = fakegpu.alloc(40 * MIB)
def step():
    act = fakegpu.alloc(20 * MIB)
    fakegpu.free(act)
    grads = fakegpu.alloc(12 * MIB, stack=False)
    return grads
g = step()
fakegpu.free(g)
fakegpu.spike(16 * MIB)
for size in (10, 14, 12):
    fakegpu.spike(size * MIB)
"""


@pytest.fixture
def gpu(monkeypatch):
    device = FakeGpu()
    module = types.ModuleType("fakegpu")
    module.alloc, module.free, module.spike = device.alloc, device.free, device.spike
    monkeypatch.setitem(sys.modules, "fakegpu", module)
    return device


def run_fake(tmp_path: Path, gpu: FakeGpu, snapshot: bool = True, entries: int = 1000, name: str = "r"):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    prepared = prepare(RunOptions(script=str(script), out_dir=str(tmp_path), run_name=name, device="cpu"))
    options = replace(prepared.options, snapshot=snapshot, snapshot_entries=entries)
    prepared = replace(prepared, options=options, device=Device("cuda", 0))
    sampler = CudaSampler("cuda:0", reader=_NoDriver(), stats=gpu.stats)
    stream = _Sink()
    result = execute(prepared, stream, sampler=sampler, history=gpu if snapshot else None)
    return result, {r.line: r for r in read_lines(result.folder / "lines.csv")}, stream.text


class _NoDriver:
    def driver(self, device: str) -> None:
        return None

    def rss(self) -> None:
        return None


class _Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_without_a_snapshot_lines_below_the_high_water_mark_get_lower_bounds(tmp_path, gpu):
    """The baseline the snapshot improves on: the runner's own readings."""
    result, lines, _ = run_fake(tmp_path, gpu, snapshot=False)
    assert result.exit_code == 0 and result.snapshot is None
    assert (lines[11].peak, lines[11].peak_exact) == (40 * MIB, False)  # its 16 MiB temporary unseen
    assert (lines[13].peak, lines[13].peak_exact) == (40 * MIB, False)
    assert (lines[9].peak, lines[9].peak_exact) == (60 * MIB, True)  # it raised the mark
    assert not (result.folder / "snapshot.pickle").exists()


def test_snapshot_gives_every_line_its_exact_peak(tmp_path, gpu):
    result, lines, summary = run_fake(tmp_path, gpu)
    assert result.exit_code == 0 and gpu.started_with == 1000 and gpu.trace is None  # stopped
    expected = {3: 40, 5: 60, 6: 60, 7: 52, 8: 52, 9: 60, 10: 52, 11: 56, 13: 54}
    assert {n: lines[n].peak // MIB for n in expected} == expected
    assert all(r.peak_exact for r in lines.values())
    assert lines[13].hits == 3 and lines[11].increment == 0
    merge = result.snapshot
    # 7 allocations and 6 frees, all in the trace; lines 11 and 13 rose above the readings
    assert (merge.counted, merge.traced, merge.outside, merge.placed, merge.note) == (13, 13, 0, 1, "")
    assert (merge.lines, merge.exact, merge.raised) == (len(lines), len(lines), 2)
    assert merge.entries == len(load_snapshot(result.folder / "snapshot.pickle").device_traces[0])
    assert "Snapshot: snapshot.pickle" in summary and "13 of the 13 allocations and frees" in summary
    assert "Line peaks from the trace:" in (result.folder / "report.txt").read_text()


def test_snapshot_analysis_names_script_lines_and_places_stackless_entries(tmp_path, gpu):
    result, _, _ = run_fake(tmp_path, gpu)
    with (result.folder / "snapshot_lines.csv").open() as handle:
        rows = {(Path(r["file"]).name, int(r["line"])): r for r in csv.DictReader(handle)}
    # the 12 MiB allocation made without a stack is given the line that ran it
    assert rows[("train.py", 7)]["allocated"] == str(12 * MIB)
    assert rows[("train.py", 7)]["function"] == "step"
    assert rows[("train.py", 5)]["allocated"] == str(20 * MIB)
    assert int(rows[("train.py", 13)]["hits"]) == 3
    assert (result.folder / "snapshot.json").exists()
    assert "train.py:11" in (result.folder / "snapshot_report.txt").read_text()  # a temporary's line


def test_lines_whose_entries_left_the_ring_buffer_keep_the_runners_peak(tmp_path, gpu):
    result, lines, _ = run_fake(tmp_path, gpu, entries=12)
    merge = result.snapshot
    assert merge.traced < merge.counted == 13 and merge.outside > 0 and not merge.note
    assert (lines[6].peak, lines[6].peak_exact) == (60 * MIB, False)  # its free fell out
    assert (lines[13].peak, lines[13].peak_exact) == (54 * MIB, True)  # still in the trace
    assert (lines[3].peak, lines[3].peak_exact) == (40 * MIB, True)  # it raised the mark


def test_a_script_that_never_starts_cuda_writes_no_snapshot(tmp_path):
    class Idle(FakeGpu):
        def start(self, max_entries: int) -> None:  # armed, but CUDA never starts
            self.started_with = max_entries

    script = tmp_path / "plain.py"
    script.write_text("x = 1\n")
    prepared = prepare(RunOptions(script=str(script), out_dir=str(tmp_path), run_name="p", device="cpu"))
    prepared = replace(prepared, options=replace(prepared.options, snapshot=True), device=Device("cuda", 0))
    idle = Idle()
    result = execute(prepared, _Sink(), sampler=CudaSampler("cuda:0", _NoDriver(), idle.stats), history=idle)
    assert result.exit_code == 0 and not (result.folder / "snapshot.pickle").exists()
    assert result.snapshot.file == "" and "never started CUDA" in result.snapshot.note
    assert "Snapshot: none written" in (result.folder / "report.txt").read_text()


def test_the_trace_disagreeing_with_the_allocator_is_not_merged(tmp_path, gpu):
    class Lossy(FakeGpu):
        def _record(self, seen: int, stack: bool) -> None:
            super()._record(seen, stack)
            if self.trace is not None:  # frees the allocator counted but the trace lost
                kept = [e for e in self.trace if e["action"] != "free_requested"]
                self.trace = deque(kept, maxlen=self.trace.maxlen)

    lossy = Lossy()
    module = sys.modules["fakegpu"]
    module.alloc, module.free, module.spike = lossy.alloc, lossy.free, lossy.spike
    result, lines, _ = run_fake(tmp_path, lossy)
    assert "replayed trace ends at" in result.snapshot.note
    assert (lines[11].peak, lines[11].peak_exact) == (40 * MIB, False)  # the runner's own figure
    assert (result.folder / "snapshot_lines.csv").exists()  # the analysis is still written


def test_a_trace_missing_entries_is_caught_by_the_line_readings(tmp_path, gpu):
    """An allocation and its free missing from the trace (as when the script pauses the
    recording itself): the trace still ends at the right bytes, but counting back from its
    end puts line runs on the wrong entries, and their readings disagree with the replay."""

    class Gappy(FakeGpu):
        def _record(self, seen: int, stack: bool) -> None:
            super()._record(seen, stack)
            if self.trace is not None:  # line 11's 16 MiB temporary is not recorded
                kept = [e for e in self.trace if e["size"] != 16 * MIB]
                self.trace = deque(kept, maxlen=self.trace.maxlen)

    gappy = Gappy()
    module = sys.modules["fakegpu"]
    module.alloc, module.free, module.spike = gappy.alloc, gappy.free, gappy.spike
    result, lines, _ = run_fake(tmp_path, gappy)
    merge = result.snapshot
    assert (merge.counted, merge.traced) == (13, 11)
    # 10 line runs allocated or freed; the 2 counted before the trace's start are outside it
    assert merge.note == "3 of 10 line runs began or ended at bytes other than the replay's"
    assert (lines[13].peak, lines[13].peak_exact) == (40 * MIB, False)  # the runner's own figure


def test_snapshot_needs_cuda_and_stops_before_anything_runs(tmp_path, in_process):
    script = tmp_path / "main.py"
    script.write_text("open('ran', 'w').close()\n")
    out = tmp_path / "reports"
    done = in_process("run", "--snapshot", "--device", "cpu", "--out-dir", out, script)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "needs a CUDA device" in done.stderr
    assert not out.exists() and not (tmp_path / "ran").exists()
    done = in_process("run", "--snapshot-entries", "10", "--device", "cpu", "--out-dir", out, script)
    assert done.returncode == 2 and "only applies with --snapshot" in done.stderr


def test_line_windows_forget_executions_older_than_the_ring_buffer():
    code = test_line_windows_forget_executions_older_than_the_ring_buffer.__code__
    windows = LineWindows(keep=5)
    windows.add(code, 1, 0, 2, 0, 512)
    windows.add(code, 2, 2, 4, 512, 0)
    windows.add(code, 1, 4, 8, 0, 0)  # 8 - 5 = 3: the window ending at 2 can no longer be traced
    assert [(line, start, stop) for _, line, start, stop, _, _ in windows] == [(2, 2, 4), (1, 4, 8)]
    assert windows.forgotten == {(code, 1): 1}


def test_history_calls_follow_torchs_signatures():
    calls: list[tuple[tuple, dict]] = []

    def modern(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None):
        calls.append(
            ((), {"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries})
        )

    def legacy(enabled, record_context=True, trace_alloc_max_entries=1, trace_alloc_record_context=False):
        calls.append(
            (
                (enabled,),
                {"ctx": record_context, "n": trace_alloc_max_entries, "alloc": trace_alloc_record_context},
            )
        )

    start, stop = history_calls(types.SimpleNamespace(_record_memory_history=modern), 7)
    start(), stop()
    assert calls == [
        ((), {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 7}),
        ((), {"enabled": None, "context": "all", "stacks": "all", "max_entries": sys.maxsize}),
    ]
    calls.clear()
    start, stop = history_calls(types.SimpleNamespace(_record_memory_history=legacy), 7)
    start(), stop()
    assert calls == [
        ((True,), {"ctx": True, "n": 7, "alloc": True}),
        ((False,), {"ctx": True, "n": 1, "alloc": False}),
    ]
    assert history_calls(types.SimpleNamespace(), 7) is None
    assert history_calls(types.SimpleNamespace(_record_memory_history=lambda enabled: None), 7) is None


def test_torch_history_waits_for_cuda_and_uses_this_torchs_api(monkeypatch, tmp_path):
    """Against the installed torch's own functions' signatures; CUDA's start is simulated."""
    import torch

    memory = torch.cuda.memory
    real = memory._record_memory_history
    calls: list[dict] = []
    queued: list[Any] = []

    def record(*args: Any, **kwargs: Any) -> None:
        inspect.signature(real).bind(*args, **kwargs)  # the installed torch accepts them
        calls.append(kwargs)

    monkeypatch.setattr(memory, "_record_memory_history", record)
    monkeypatch.setattr(memory, "_dump_snapshot", lambda filename: Path(filename).write_bytes(b"dumped"))
    monkeypatch.setattr(torch.cuda, "_lazy_call", queued.append)
    history = TorchHistory()
    history.start(5000)
    assert calls == [] and len(queued) == 1  # nothing until the script starts CUDA
    assert history.dump(tmp_path / "s.pickle") is False
    queued[0]()  # CUDA starts
    assert calls == [{"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000}]
    assert history.dump(tmp_path / "s.pickle") is True and (tmp_path / "s.pickle").read_bytes() == b"dumped"
    history.stop()
    assert calls[-1] == {"enabled": None} and not history.recording
    queued[0]()  # a late start after stop records nothing
    assert len(calls) == 2


def _record(line: int, peak: int, exact: bool) -> LineRecord:
    return LineRecord("/src/t.py", "main", line, "", 1, 0, 0, peak, exact, 0.0)


def test_window_peaks_read_the_levels_inside_each_window_and_count_those_outside():
    levels = [5, 9, 4, 7, 3]  # allocated after counted entries 11..15 (first = 10)
    a, b = ("/src/t.py", "main", 1), ("/src/t.py", "main", 2)
    windows = [(a, 10, 12, 2, 9), (a, 12, 14, 9, 7), (b, 13, 15, 4, 3), (b, 8, 11, 0, 5)]
    peaks, outside, mismatched = window_peaks(windows, levels, first=10, start_level=2)
    assert peaks == {a: 9, b: 7} and outside == {b: 1} and mismatched == 0
    # a run whose readings disagree with the replay (it began at 4, not 2) is counted
    assert window_peaks([(a, 10, 12, 4, 9)], levels, first=10, start_level=2)[2] == 1


def test_innermost_lines_give_each_entry_the_deepest_running_line():
    outer, inner, other = ("f", "m", 1), ("f", "g", 5), ("f", "g", 6)
    windows = [(inner, 2, 5, 0, 0), (other, 6, 8, 0, 0), (outer, 0, 10, 0, 0)]  # in the order they ended
    owners = innermost_lines(windows, first=1, traced=10)
    assert owners == [outer, inner, inner, inner, outer, other, other, outer, outer, None]


def test_merge_keeps_the_runners_exact_peak_only_when_the_trace_cannot_beat_it():
    key = ("/src/t.py", "main", 1)
    merged = merge_peaks([_record(1, 50, True)], {key: 40}, {key: 2})
    assert (merged[0].peak, merged[0].peak_exact) == (50, True)
    merged = merge_peaks([_record(1, 30, True)], {key: 40}, {key: 2})
    assert (merged[0].peak, merged[0].peak_exact) == (40, False)  # an unseen run may go higher
    merged = merge_peaks([_record(1, 30, False), _record(2, 8, False)], {key: 40}, {})
    assert [(r.peak, r.peak_exact) for r in merged] == [(40, True), (8, True)]  # line 2: no events
