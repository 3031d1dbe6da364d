"""Each file schema is defined once: the columns come from the records, and the hand-written
hot-path timeline writer produces exactly those columns and values."""

from __future__ import annotations

import csv
import itertools
from dataclasses import fields

from gpu_mem_track.runfolder.files import (
    LINE_COLUMNS,
    TIMELINE_COLUMNS,
    TimelineWriter,
    read_lines,
    read_timeline,
    write_lines,
)
from gpu_mem_track.runfolder.records import LineRecord, TimelineRow
from gpu_mem_track.runner.profiler import LineProfiler
from gpu_mem_track.runner.samplers import FakeSampler
from gpu_mem_track.runner.tracer import SettraceEngine
from gpu_mem_track.runs.load import TRACKER_COLUMNS
from gpu_mem_track.tracker import csvlog
from gpu_mem_track.tracker.records import Ledger


def test_columns_are_the_records_fields():
    assert LINE_COLUMNS == tuple(f.name for f in fields(LineRecord))
    assert TIMELINE_COLUMNS == tuple(f.name for f in fields(TimelineRow))
    assert TRACKER_COLUMNS == csvlog.REQUIRED_COLUMNS
    assert set(TRACKER_COLUMNS) | set(csvlog.CATEGORY_COLUMNS) | {"rank"} == set(csvlog.COLUMNS)
    ledger_figures = [f.name for f in fields(Ledger) if f.name not in ("device", "categories")]
    assert all(name in csvlog.COLUMNS for name in ledger_figures)


class _CudaLikeSampler(FakeSampler):
    """Every reading known: allocated (the CUDA path), reserved, driver and RSS. A fake:
    the driver reading (NVML) is one the simulated GPU cannot give."""

    source = "cuda allocator"
    reserved = 789

    def extras(self):
        return 123, 456


def _work(sampler):
    sampler.allocate(100)
    sampler.allocate(50)
    sampler.free(30)


def test_the_hot_path_writer_writes_exactly_the_schema(tmp_path):
    path = tmp_path / "timeline.csv"
    sampler, timeline = _CudaLikeSampler(), TimelineWriter(tmp_path / "timeline.csv")
    ticks = itertools.count()
    profiler = LineProfiler(sampler, timeline, extras_every=0.0, clock=lambda: next(ticks) * 0.25)
    profiler.event_row("start", where=("script.py", "<module>", None))
    engine = SettraceEngine(profiler, lambda code: code is _work.__code__)
    engine.start()
    try:
        _work(sampler)
    finally:
        engine.stop()
    profiler.finish()
    profiler.event_row("track", "after work", ("script.py", "main", 9))
    timeline.close()

    with path.open(newline="") as handle:
        raw = list(csv.reader(handle))
    assert tuple(raw[0]) == TIMELINE_COLUMNS
    assert all(len(row) == len(TIMELINE_COLUMNS) for row in raw[1:])
    rows = list(read_timeline(path))
    assert [row.seq for row in rows] == list(range(1, len(rows) + 1))
    assert [row.event for row in rows] == ["start", "line", "line", "line", "track"]
    first = _work.__code__.co_firstlineno
    records = {record.line: record for record in profiler.records()}
    for row in rows[1:4]:
        record = records[row.line]  # each line ran once: its row holds its record's figures
        assert (row.file, row.function, row.label) == (__file__, "_work", "")
        assert (row.memory, row.increment, row.peak) == (record.memory, record.increment, record.peak)
        assert (row.allocated, row.reserved, row.driver, row.rss) == (row.memory, 789, 123, 456)
        assert isinstance(row.elapsed, float) and row.elapsed > 0
    assert [row.line for row in rows[1:4]] == [first + 1, first + 2, first + 3]
    assert [row.memory for row in rows[1:4]] == [100, 150, 120]
    last = rows[-1]
    assert (last.file, last.function, last.line, last.label) == ("script.py", "main", 9, "after work")
    assert (last.memory, last.increment, last.peak, last.allocated) == (120, None, None, 120)


def test_lines_csv_round_trips_through_the_schema(tmp_path):
    record = LineRecord("a.py", "f", 3, "x = 1", 2, 100, 50, 150, True, 0.25)
    write_lines(tmp_path / "lines.csv", [record])
    with (tmp_path / "lines.csv").open(newline="") as handle:
        assert tuple(next(csv.reader(handle))) == LINE_COLUMNS
    assert read_lines(tmp_path / "lines.csv") == [record]
