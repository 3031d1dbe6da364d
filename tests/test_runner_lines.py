"""What the runner says about lines: the run's peak named at the line that allocated it,
each line's own rise beside its net increment, hits per execution of a statement."""

from __future__ import annotations

import csv

from test_runner import folder, run, write
from test_tracer import run_traced

from gpu_mem_track.runfolder.files import LINE_REQUIRED, read_lines, read_meta
from gpu_mem_track.runfolder.records import LineRecord, hottest
from gpu_mem_track.runfolder.render import render_line_report, render_summary
from gpu_mem_track.runner.profiler import LineProfiler
from gpu_mem_track.runner.samplers import FakeSampler
from gpu_mem_track.runner.tracer import SettraceEngine
from gpu_mem_track.runs.load import load_run

MIB = 2**20


def test_the_peak_is_named_at_the_line_that_allocated_it_not_a_bystander():
    sampler = FakeSampler()
    profiler = LineProfiler(sampler)

    def work():
        sampler.allocate(100 * MIB)  # what makes the peak
        sampler.allocate(4096)  # bystanders: one more page each, at the high-water mark
        sampler.allocate(4096)
        sampler.free(8192)

    run_traced(profiler, work)
    profiler.finish()
    first = work.__code__.co_firstlineno
    assert profiler.peak == 100 * MIB + 8192
    assert profiler.peak_at == (__file__, first + 1)


def test_the_innermost_line_that_allocated_is_named_not_the_call_around_it():
    sampler = FakeSampler()
    profiler = LineProfiler(sampler)

    def allocate():
        sampler.allocate(100 * MIB)
        sampler.allocate(MIB // 2)  # so the call around it rises more than this line

    def main():
        allocate()
        sampler.allocate(4096)

    engine = SettraceEngine(profiler, lambda code: code in (main.__code__, allocate.__code__))
    engine.start()
    try:
        main()
    finally:
        engine.stop()
    profiler.finish()
    records = {(r.function.rsplit(".", 1)[-1], r.line): r for r in profiler.records()}
    call = records[("main", main.__code__.co_firstlineno + 1)]
    assert call.rise == 100 * MIB + MIB // 2  # the call rose more, but it ended later
    assert profiler.peak_at == (__file__, allocate.__code__.co_firstlineno + 1)


def test_a_later_and_higher_peak_takes_over():
    sampler = FakeSampler()
    profiler = LineProfiler(sampler)

    def work():
        sampler.allocate(100 * MIB)
        sampler.free(100 * MIB)
        sampler.allocate(50 * MIB)
        sampler.allocate(60 * MIB)  # 110 MiB: beyond 1% of the first peak

    run_traced(profiler, work)
    profiler.finish()
    assert profiler.peak_at == (__file__, work.__code__.co_firstlineno + 4)


def test_rise_shows_what_a_line_allocated_when_it_also_freed_more():
    sampler = FakeSampler()
    sampler.allocate(300)  # the previous step's graph

    def forward():
        sampler.allocate(180)  # the new graph, while the old one is still held
        sampler.free(480)
        sampler.allocate(180)  # the old graph gone

    profiler = LineProfiler(sampler)

    def loop():
        for _ in range(2):
            forward()

    run_traced(profiler, loop)
    profiler.finish()
    record = next(r for r in profiler.records() if r.line == loop.__code__.co_firstlineno + 2)
    assert (record.increment, record.rise, record.hits) == (-240, 180, 2)
    assert hottest([record]) == [record]  # it grew memory although its net is negative


def test_end_to_end_peak_line_rise_and_hits(tmp_path):
    script = write(
        tmp_path / "peaky.py",
        """
        def make(n,
                 fill):
            return fill * n
        big = make(
            150 * 2**20,
            b"x",
        )
        small = [make(8192, b"y") for _ in range(4)]
        more = [bytearray(256 * 2**10) for _ in range(3)]  # new pages above the high
        for i in range(3):
            tail = make(
                4096, b"z")
        """,
    )
    done = run(tmp_path, str(script))
    assert done.returncode == 0, done.stderr
    out = folder(tmp_path)
    meta = read_meta(out / "meta.json")
    # the callee's line that made the bytes, not the call (5) nor a later bystander
    assert meta.peak_at == f"{script}:4"
    lines = {(r.function, r.line): r for r in read_lines(out / "lines.csv")}
    assert lines[("<module>", 5)].rise >= 150 * MIB and lines[("<module>", 5)].hits == 1
    assert lines[("<module>", 12)].hits == 3 and ("<module>", 13) not in lines
    assert ("<module>", 6) not in lines and ("<module>", 7) not in lines
    report = (out / "report.txt").read_text()
    assert f"peak {_mib(meta.peak)} at peaky.py:{meta.peak_at.rsplit(':')[1]}" in report
    assert "Rise" in report.splitlines()[next(i for i, t in enumerate(report.splitlines()) if "Line #" in t)]
    assert load_run(out).peak == meta.peak


def _mib(nbytes: int) -> str:
    from gpu_mem_track.units import format_bytes

    return format_bytes(nbytes)


def test_lines_csv_has_rise_and_older_files_without_it_still_read(tmp_path):
    path = tmp_path / "lines.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(LINE_REQUIRED)
        writer.writerow(["/src/t.py", "main", 3, "x = f()", 2, 10 * MIB, -5 * MIB, 12 * MIB, "True", 0.5])
    (record,) = read_lines(path)
    assert record.rise is None and record.growth == -5 * MIB
    assert hottest([record]) == []
    assert LineRecord.from_dict(record.to_dict()) == record
    info = read_meta_like()
    report = render_line_report(info, [record])
    assert "             -" in report.splitlines()[-1]  # the rise column, unknown
    assert "x = f()" not in render_summary(info, [record], tmp_path)


def test_the_summary_lists_only_the_report_files_that_were_written(tmp_path):
    info = read_meta_like()
    last = render_summary(info, [], tmp_path).splitlines()[-1]
    assert last.endswith("(report.txt, lines.csv, timeline.csv)")
    last = render_summary(info, [], tmp_path, unwritten={"report.txt", "timeline.csv"}).splitlines()[-1]
    assert last.startswith("Reports: ") and last.endswith("(lines.csv)")
    gone = {"report.txt", "lines.csv", "timeline.csv"}
    assert render_summary(info, [], tmp_path, unwritten=gone).rstrip().endswith("(none written)")


def read_meta_like():
    from gpu_mem_track.runfolder.records import RunInfo

    return RunInfo(
        "r", "/src/t.py", ("t.py",), "cuda:0", "cuda allocator", "sys.settrace", 0.0, "3.11", "", "0"
    )
