from __future__ import annotations

import dataclasses
import gc
import inspect
import io
import re
import sys
import weakref

import pandas as pd
import pytest
import torch
from torch import nn

from gpu_mem_track import MemTracker, UsageError, read_stamps
from gpu_mem_track.tracker.readers import AllocatorReading, DriverReading, FakeReader
from gpu_mem_track.units import format_bytes

MiB = 2**20


def test_no_argument_tracker_writes_reports_under_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tracker = MemTracker(verbosity=0, probe=False)
    x = torch.zeros(1000)
    tracker.track()
    assert tracker.files.folder.resolve() == tmp_path / "reports"
    assert tracker.files.csv.exists() and tracker.files.log.exists()
    assert ":" not in tracker.files.csv.name and ":" not in tracker.files.log.name
    del x


def test_classic_constructor_forms(tmp_path):
    classic = MemTracker(inspect.currentframe(), path=tmp_path, verbosity=0, probe=False)
    positional = MemTracker(None, False, tmp_path, False, "cpu", verbosity=0, probe=False)
    detail_first = MemTracker(False, tmp_path / "logs", True, "cpu", probe=False, stream=io.StringIO())
    assert classic.files.folder == tmp_path and classic.detail is True
    assert positional.detail is False and positional.device == "cpu"
    assert detail_first.detail is False and detail_first.files.folder == tmp_path / "logs"
    assert detail_first.verbosity == 2 and detail_first.device == "cpu"
    with pytest.raises(UsageError, match="first argument is a frame or None, not str"):
        MemTracker("reports/")


@pytest.mark.parametrize(
    ("device", "resolved"),
    [(0, "cuda:0"), ("cuda:1", "cuda:1"), (torch.device("cuda", 2), "cuda:2"), ("cpu", "cpu")],
)
def test_device_argument_is_honoured(device, resolved):
    # An injected reader stands for the device: no fallback even without CUDA. Where CUDA
    # runs, a device it does not have is refused (test_a_gpu_this_machine_lacks_is_refused).
    index = int(resolved.partition(":")[2] or -1)
    if torch.cuda.is_available() and index >= torch.cuda.device_count():
        pytest.skip(f"{resolved} needs {index + 1} GPUs; this machine has {torch.cuda.device_count()}")
    assert MemTracker(device=device, out_dir=None, verbosity=0, reader=FakeReader()).device == resolved


@pytest.mark.cuda
def test_a_gpu_this_machine_lacks_is_refused():
    torch.cuda.init()  # the count is checked once CUDA runs (the tracker never starts it)
    count = torch.cuda.device_count()
    with pytest.raises(UsageError, match=rf"^no such device: cuda:{count} \({count} CUDA devices visible\)$"):
        _ = MemTracker(device=f"cuda:{count}", out_dir=None, verbosity=0, reader=FakeReader()).device


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda:0", "cuda", 0], ids=["index-string", "no-index", "index"])
def test_cuda_asked_where_cuda_is_not_available_reports_cpu_tensors_and_says_so(tmp_path, device):
    stream = io.StringIO()
    tracker = MemTracker(device=device, out_dir=tmp_path, verbosity=1, stream=stream, probe=False)
    kept = torch.zeros(1000)
    first = tracker.track()
    tracker.track()
    assert tracker.device == "cpu" and first.ledger.device == "cpu"
    assert first.ledger.tensors >= 4000 and first.ledger.rss is not None
    notes = [line for line in stream.getvalue().splitlines() if "CUDA is not available here" in line]
    assert len(notes) == 1 and "so the stamps report CPU tensors" in notes[0]
    assert "not initialised" not in stream.getvalue()
    assert "# gpu_mem_track: CUDA is not available here" in tracker.files.log.read_text()
    del kept


def test_bad_arguments_name_the_problem(tmp_path):
    with pytest.raises(UsageError, match="not a device: 'gpu7'"):
        MemTracker(device="gpu7", out_dir=None)
    with pytest.raises(UsageError, match="CUDA index >= 0, not -1"):
        MemTracker(device=-1, out_dir=None)
    with pytest.raises(UsageError, match="census must be 'fast' or 'full'"):
        MemTracker(census="quick", out_dir=None)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot write reports to"):
        MemTracker(out_dir=blocker / "reports")
    with pytest.raises(UsageError, match="cannot write reports to .*: it is a file, not a folder$"):
        MemTracker(out_dir=blocker)  # not "File exists" (issue 9, item 20)


def test_track_stamps_caller_line_and_writes_stamp_before_changes(quiet_tracker):
    stream = io.StringIO()
    tracker = quiet_tracker(verbosity=1, stream=stream)
    before = tracker.track("baseline")  # the census is process-wide: start from what is alive
    stream.truncate(0)
    stream.seek(0)
    model = nn.Linear(4, 3)
    tracker.watch(model)
    line = sys._getframe().f_lineno + 1
    stamp = tracker.track("after model")
    assert stamp.ledger.tensors - before.ledger.tensors == 60
    assert (stamp.line, stamp.function, stamp.label) == (
        line,
        "test_track_stamps_caller_line_and_writes_stamp_before_changes",
        "after model",
    )
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith(f"At test_tracker.py:{line} test_track_stamps_caller")
    assert f" [after model] | cpu | tensors {format_bytes(stamp.ledger.tensors)} | process RSS " in lines[0]
    assert lines[1].startswith("  ledger: CPU tensors ")
    assert stamp.ledger.categories.parameter - before.ledger.categories.parameter == 60
    assert lines[2].startswith("  categories: parameter ")
    assert lines[2].endswith(f" = tensors {format_bytes(stamp.ledger.tensors)}")
    assert lines[3:] == [
        "+ | 1 * Size:(3, 4) | Memory: 48 B | Parameter | float32 | weight",
        "+ | 1 * Size:(3,)   | Memory: 12 B | Parameter | float32 | bias",
    ]
    assert tracker.files.log.read_text().endswith(stream.getvalue())


def test_count_deltas_and_disappearing_tensors(quiet_tracker):
    tracker = quiet_tracker()
    tracker.track()
    a, b, c = torch.zeros(256), torch.zeros(256), torch.zeros(256)
    tracker.watch(a=a, b=b, c=c)
    grown = tracker.track()
    del a, b
    shrunk = tracker.track()
    assert [(ch.sign, ch.count_delta, ch.bytes_delta, ch.names) for ch in grown.changes] == [
        ("+", 3, 3072, ("a", "b", "c"))
    ]
    assert [(ch.sign, ch.count_delta, ch.bytes_delta, ch.names) for ch in shrunk.changes] == [
        ("-", -2, -2048, ("a", "b"))
    ]
    del c


def test_csv_is_flushed_at_every_track_and_round_trips(quiet_tracker):
    tracker = quiet_tracker()
    tracker.track("one")
    assert [s.label for s in read_stamps(tracker.files.csv)] == ["one"]
    y = torch.ones(10, dtype=torch.int16)
    tracker.watch(y=y)
    tracker.track("two")
    stamps = read_stamps(tracker.files.csv)
    assert [s.label for s in stamps] == ["one", "two"]
    assert stamps[1].changes[0].names == ("y",) and stamps[1].changes[0].nbytes == 20
    frame = tracker.to_dataframe()
    assert list(frame.columns) == list(pd.read_csv(tracker.files.csv).columns)
    assert frame[frame["row"] == "totals"]["label"].tolist() == ["one", "two"]
    change = frame[frame["row"] == "change"].iloc[-1]
    assert (change["shape"], change["names"], change["bytes"]) == ("10", "y", 20)
    assert frame.loc[0, "kind"] == "" and pd.isna(frame.loc[0, "allocated"])
    del y


def test_dataframe_before_any_stamp_and_text_columns_stay_text(quiet_tracker):
    tracker = quiet_tracker()
    assert tracker.to_dataframe().empty
    tracker.track("007")
    frame = tracker.to_dataframe()
    assert frame[frame["row"] == "totals"]["label"].tolist() == ["007"]


def test_in_memory_tracker_gives_the_same_dataframe(quiet_tracker, tmp_path):
    reader = FakeReader(rss_bytes=123)
    on_disk = quiet_tracker(run_name="same", clock=lambda: 100.0, reader=reader)
    in_memory = quiet_tracker(out_dir=None, clock=lambda: 100.0, reader=reader)
    z = torch.zeros(7)
    for tracker in (on_disk, in_memory):
        tracker.track("x")
    pd.testing.assert_frame_equal(on_disk.to_dataframe(), in_memory.to_dataframe())
    del z


BAD_ROW = r": not a valid report row \("


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("rss", "12 MB", BAD_ROW + "not an integer"),
        ("elapsed", "nan", BAD_ROW + "not a finite"),
        ("row", "total", BAD_ROW + "row type 'total'"),
        ("rss", "9" * 30, None),
    ],
)
def test_dataframe_of_a_damaged_csv_is_one_line_naming_the_file(quiet_tracker, column, value, problem):
    import csv

    from gpu_mem_track.errors import BadInput

    tracker = quiet_tracker(run_name="edited")
    tracker.track("one")
    tracker.track("two")
    good = tracker.to_dataframe()
    path = tracker.files.csv
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    # the totals row of "two" (tensors left by other tests may add change rows before it)
    (index,) = [i for i, row in enumerate(rows) if row["row"] == "totals" and row["label"] == "two"]
    rows[index][column] = value
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows[:index])
    line = text.getvalue().count("\n") + 1  # where the edited row starts
    writer.writerows(rows[index:])
    path.write_text(text.getvalue(), encoding="utf-8", newline="")
    where = f", line {line}" + problem if problem else ": column 'rss' holds integers beyond 64 bits"
    with pytest.raises(BadInput, match="^" + re.escape(str(path)) + where):
        tracker.to_dataframe()
    assert good["rss"].dtype.kind in "if" and good["elapsed"].dtype == "float64"  # numbers before the edit


def test_detail_false_prints_totals_only(quiet_tracker):
    stream = io.StringIO()
    tracker = quiet_tracker(detail=False, verbosity=1, stream=stream)
    w = torch.zeros(3)
    tracker.track()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and lines[2].startswith("  categories: ")
    del w


def test_verbosity_two_lists_every_live_group(quiet_tracker):
    stream = io.StringIO()
    tracker = quiet_tracker(verbosity=2, stream=stream)
    kept = torch.zeros(5)
    tracker.watch(kept=kept)
    tracker.track()
    tracker.track()
    last = stream.getvalue().split("At ")[-1]
    assert "= | 1 * Size:(5,) | Memory: 20 B | Tensor | float32 | kept" in last
    del kept


def test_run_names_are_made_safe_and_unique(quiet_tracker):
    first = quiet_tracker(run_name="fp32: batch 32/64")
    second = quiet_tracker(run_name="fp32: batch 32/64")
    assert first.run_name == "fp32_batch_32_64"
    assert second.run_name == "fp32_batch_32_64-2"


def test_ledger_reconciles_injected_cuda_figures(quiet_tracker, probe_result):
    # A fake reader, not the simulated GPU: the driver-level figure (NVML) and the probed
    # CUDA context are what this checks, and a simulation has no driver to read (the
    # allocator's side of the ledger runs on the simulated GPU in test_cuda.py).
    reader = FakeReader(
        allocator_reading=AllocatorReading(
            allocated=10 * MiB, requested=9 * MiB, reserved=20 * MiB, peak_allocated=30 * MiB
        ),
        driver_reading=DriverReading(600 * MiB, "nvml process"),
    )
    tracker = quiet_tracker(device="cuda:0", reader=reader, probe=lambda device: probe_result)
    ledger = tracker.track().ledger
    assert ledger.tensors == 0  # no CUDA tensors on this machine
    assert (ledger.hidden, ledger.cache, ledger.framework) == (10 * MiB, 10 * MiB, 580 * MiB)
    assert (ledger.context, ledger.framework_other) == (500 * MiB, 80 * MiB)
    assert sum(ledger.parts().values()) == ledger.driver
    assert ledger.breakdown() == {
        **dict.fromkeys(("parameter", "buffer", "optimizer state", "gradient", "input", "activation"), 0),
        "other": 0,
        "hidden": 10 * MiB,
        "allocator cache": 10 * MiB,
        "framework": 580 * MiB,
    }
    assert (ledger.total_name, ledger.total) == ("driver", 600 * MiB)
    frame = tracker.to_dataframe()
    assert frame.loc[0, "framework_other"] == 80 * MiB and frame.loc[0, "driver_source"] == "nvml process"
    parts = [c for c in frame.columns if c.startswith("cat_")] + ["hidden", "cache", "framework"]
    assert frame.loc[0, parts].sum() == frame.loc[0, "driver"]


def test_probe_failure_is_reported_once_and_tracking_goes_on(quiet_tracker):
    from gpu_mem_track.tracker.probe import ProbeError

    calls = []

    def failing(device):
        calls.append(device)
        raise ProbeError("no NVML here")

    stream = io.StringIO()
    reader = FakeReader(AllocatorReading(0, 0, 0, 0), DriverReading(100, "nvml process"))
    tracker = quiet_tracker(device="cuda:0", reader=reader, probe=failing, verbosity=1, stream=stream)
    tracker.track()
    tracker.track()
    assert calls == ["cuda:0"]
    assert stream.getvalue().count("no CUDA context probe (no NVML here)") == 1
    assert tracker.track().ledger.context is None


def test_region_as_context_manager_and_decorator(quiet_tracker):
    tracker = quiet_tracker()
    with tracker.region("forward"):
        inside = torch.zeros(64)

    @tracker.region("step")
    def step():
        return torch.zeros(32)

    kept = step()
    labels = [(s.label, s.function) for s in read_stamps(tracker.files.csv)]
    assert labels == [
        ("forward start", "test_region_as_context_manager_and_decorator"),
        ("forward end", "test_region_as_context_manager_and_decorator"),
        ("step start", "test_region_as_context_manager_and_decorator.<locals>.step"),
        ("step end", "test_region_as_context_manager_and_decorator.<locals>.step"),
    ]
    del inside, kept


def test_watch_rejects_what_it_cannot_name(quiet_tracker):
    with pytest.raises(TypeError, match="not int"):
        quiet_tracker().watch(3)


@pytest.mark.slow
def test_tracking_keeps_no_tensor_alive(quiet_tracker):
    tracker = quiet_tracker(verbosity=2, stream=io.StringIO())
    model = nn.Linear(50, 50)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 50)).sum().backward()
    optimizer.step()
    tracker.watch(model, optimizer, extra=torch.zeros(9))
    x = torch.zeros(100)
    tracker.track()
    refs = [
        weakref.ref(t) for t in (x, model.weight, model.weight.grad, *optimizer.state[model.weight].values())
    ]
    refs.append(weakref.ref(model))
    del model, optimizer, x
    gc.collect()
    assert all(r() is None for r in refs)
    tracker.track()  # watched objects are gone: nothing breaks


def test_track_reads_a_cached_probe_and_never_measures(quiet_tracker, probe_result, monkeypatch, tmp_path):
    from gpu_mem_track.tracker import probe

    def no_process(*args, **kwargs):
        raise AssertionError("track() started a process")

    monkeypatch.setattr(probe.subprocess, "run", no_process)
    monkeypatch.setattr(probe.subprocess, "Popen", no_process)
    monkeypatch.setattr(probe, "_MEMORY_CACHE", {})
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path / "cache"))
    reader = FakeReader(AllocatorReading(0, 0, 0, 0), DriverReading(600 * MiB, "nvml process"))
    stream = io.StringIO()
    unmeasured = quiet_tracker(device="cuda:0", reader=reader, probe=True, verbosity=1, stream=stream)
    assert [unmeasured.track().ledger.context for _ in range(2)] == [None, None]
    hint = "run `python -m gpu_mem_track probe --device cuda:0` once"
    assert stream.getvalue().count(hint) == 1
    assert not (tmp_path / "cache").exists()
    if torch.cuda.is_initialized():  # then the tracker looks the probe up by this GPU's UUID
        probe_result = dataclasses.replace(probe_result, uuid=str(torch.cuda.get_device_properties(0).uuid))
    probe.store_probe(probe_result)  # what `gpu_mem_track probe` does
    monkeypatch.setattr(probe, "_MEMORY_CACHE", {})  # as in a later process: only the disk cache
    measured = quiet_tracker(device="cuda:0", reader=reader, probe=True)
    assert measured.track().ledger.context == 500 * MiB


def _census_from_a_callee(tracker):
    return tracker.track()


def _train_locally(tracker, collect_before_track):
    """The usual ``def train():``: model and Adam are locals, nothing is watched."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    if collect_before_track:
        gc.collect()  # the objects move to the oldest generation: the census walks the heap
    stamp = _census_from_a_callee(tracker)
    refs = [weakref.ref(model), weakref.ref(optimizer), weakref.ref(model[0].weight)]
    refs += [weakref.ref(t) for t in optimizer.state[model[0].weight].values()]
    return stamp, refs


@pytest.mark.slow
@pytest.mark.parametrize("when", ["young", "after-collection", "first-census"])
def test_function_local_model_and_adam_are_named_and_classified_without_watch(quiet_tracker, when):
    tracker = quiet_tracker()
    if when != "first-census":
        tracker.track()
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection between the calls: the path taken is the one asked for
    try:
        stamp, refs = _train_locally(tracker, collect_before_track=when == "after-collection")
        # a collection the finder saw (its gc callback took the young objects) needs no walk
        assert tracker.last_scan == ("full" if when == "first-census" else "young")
    finally:
        if was_enabled:
            gc.enable()
    names = {kind: set() for kind in ("Parameter", "Gradient", "Optimizer state")}
    for change in stamp.changes:
        names.setdefault(change.kind, set()).update(change.names)
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= names["Parameter"]
    assert {"0.weight.grad", "2.bias.grad"} <= names["Gradient"]
    assert {"exp_avg of 0.weight", "exp_avg_sq of 2.bias", "step of 0.weight"} <= names["Optimizer state"]
    state = sum(c.bytes_delta for c in stamp.changes if c.kind == "Optimizer state")
    params = (8 * 16 + 16 + 16 * 4 + 4) * 4
    assert state == 2 * params + 4 * 4  # exp_avg, exp_avg_sq and a float32 step per parameter
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)  # found, named, and kept alive by nothing
    tracker.track()


def test_a_model_moved_by_swapping_its_parameters_after_track(quiet_tracker):
    """``set_swap_module_params_on_conversion(True)`` then ``.to()`` after a ``track()``:
    ``torch.utils.swap_tensors`` refuses tensors with weak references, the census's
    included unless it drops them for the swap."""
    tracker = quiet_tracker()
    model = nn.Linear(4, 3)
    tracker.watch(model)
    before = tracker.track()
    was = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to(torch.float64)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(was)
    after = tracker.track()
    assert model.weight.dtype == torch.float64
    assert after.ledger.categories.parameter - before.ledger.categories.parameter == 60
