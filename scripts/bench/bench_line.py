"""Benchmark: what one traced line costs the runner, by the memory read it makes.

In this process, a workload of short pure-Python lines (ten a loop iteration, no torch)
runs untraced and then traced the way ``python -m gpu_mem_track run`` traces a script:
the runner's engine (``sys.monitoring`` on Python 3.12+, else ``sys.settrace``) driving a
``LineProfiler`` that writes the timeline to a file, through its Python path and through
its native line sink (``line_sink``, built first if it can be). The cost of a line is (traced -
untraced) / lines, in this thread's CPU time (``time.thread_time``: what other processes
on a busy machine take is not counted), median and min of ``--repeats`` rounds. One row
per sampler and line sink:

- ``none (FakeSampler)``: a sampler that reads nothing: the tracer and profiler alone;
- ``CudaSampler, dict read (stub dict)``: the fallback read, ``torch._C._cuda_memoryStats``,
  replaced by a function returning a prepared dict of the real one's shape: the Python
  side of that read only; building the dict itself costs 11.4 us a call on an H200
  (``fixtures/h200/logs/micro-cuda-stats.txt``), which this cannot measure without a GPU;
- ``CudaSampler, native read (stub module)``: the native read's Python side, the
  ``cuda_stats`` module replaced by one returning the five figures;
- ``CudaSampler on the simulated GPU``: ``run --simulate``'s read, under
  ``simulated_gpu(--gpu)``;
- with a real GPU (``torch.cuda.is_available()``): ``CudaSampler, dict read (real)`` and
  ``CudaSampler, native read (real)`` (the module built for this torch first, if it can be).

``sample()`` alone is timed for each sampler too (ns per call). Writes a markdown report
(``--out``) and the same data as JSON next to it. Speed targets are reported, never
asserted: on a real GPU, ``make gpu-check`` times whole training loops.

    python3 scripts/bench/bench_line.py [--repeats 5] [--iterations 20000] [--out reports/bench_line.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import CodeType, SimpleNamespace
from typing import Any

import torch
from bench_census import environment, markdown_table

from gpu_mem_track.native import build, cudastats, linesink
from gpu_mem_track.runfolder.files import TimelineWriter
from gpu_mem_track.runner.profiler import LineProfiler
from gpu_mem_track.runner.samplers import CudaSampler, FakeSampler
from gpu_mem_track.runner.tracer import best_engine

LINES_PER_ITERATION = 10
#: The share of ``--iterations`` run by the rows whose read takes far longer (simulated)
SLOW_SHARE = 20
H200_DICT_US = 11.4  # torch._C._cuda_memoryStats(0) on the H200 (fixtures/h200/logs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="rounds of each variant (default: %(default)s)"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=10_000,
        help="workload loop iterations, ten lines each (%(default)s)",
    )
    parser.add_argument("--gpu", default="h100-80gb", help="the simulated GPU (default: %(default)s)")
    parser.add_argument("--out", default="reports/bench_line.md", help="markdown report; JSON next to it")
    return parser.parse_args(argv)


def workload(iterations: int) -> int:
    """Ten short lines an iteration: what the runner's per-line cost is measured on."""
    total = 0
    for step in range(iterations):
        a = step + 1
        b = a * 2
        c = b - a
        d = c + step
        e = d % 7
        f = e + a
        g = f - b
        h = g + c
        total += h
    return total


def wants(code: CodeType) -> bool:
    return code is workload.__code__


class NoReader:
    """The memory reader a ``CudaSampler`` asks for its slower extras: nothing here."""

    def driver(self, device: str) -> None:
        return None

    def rss(self) -> None:
        return None


def stub_dict(index: int = 0) -> dict[str, Any]:
    """A dict of the shape ``torch._C._cuda_memoryStats`` returns (its 13 stat families of
    3 pools of 4 counters, and its 6 scalars; about 200 entries)."""
    stat = {"current": 512, "peak": 1024, "allocated": 3, "freed": 1}
    families = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes")
    families += ("active_bytes", "inactive_split_bytes", "requested_bytes")
    stats: dict[str, Any] = {
        name: {pool: dict(stat) for pool in ("all", "small_pool", "large_pool")} for name in families
    }
    stats.update(oversize_allocations=dict(stat), oversize_segments=dict(stat))
    stats.update(num_alloc_retries=0, num_ooms=0, max_split_size=-1, num_sync_all_streams=0)
    stats.update(num_device_alloc=1, num_device_free=0)
    return stats


PREPARED = stub_dict()


def stub_torch() -> Any:
    """A torch whose CUDA has started and whose ``_cuda_memoryStats`` returns ``PREPARED``."""

    def nested(device: Any = None) -> dict[str, Any]:
        return PREPARED

    nested.__module__ = "torch.cuda.memory"  # read as torch's own, so the native read is tried
    return SimpleNamespace(
        _C=SimpleNamespace(_cuda_memoryStats=lambda index: PREPARED),
        cuda=SimpleNamespace(is_initialized=lambda: True, memory_stats_as_nested_dict=nested),
    )


FIGURES = cudastats.figures(PREPARED)


class StubModule:
    """A ``cuda_stats`` module returning the five figures of ``PREPARED``."""

    ABI = cudastats.ABI

    def read(self, index: int) -> tuple[int, int, int, int, int]:
        return FIGURES


def samplers(args: argparse.Namespace) -> Iterator[tuple[str, Callable[[], AbstractContextManager[Any]]]]:
    """(name, a context giving the sampler) for each row."""
    yield "none (FakeSampler)", lambda: nullcontext(FakeSampler())
    yield (
        "CudaSampler, dict read (stub dict)",
        lambda: nullcontext(CudaSampler("cuda:0", reader=NoReader(), stats=lambda index: PREPARED)),
    )
    yield (
        "CudaSampler, native read (stub module)",
        lambda: nullcontext(
            CudaSampler("cuda:0", reader=NoReader(), torch_module=stub_torch(), native=StubModule())
        ),
    )
    # a slow read: a twentieth of the lines (SLOW_SHARE)
    yield f"CudaSampler on the simulated GPU ({args.gpu})", lambda: simulated(args.gpu)
    if torch.cuda.is_available():
        torch.empty(1, device="cuda")  # CUDA started, as by the program
        index = torch.cuda.current_device()
        yield (
            "CudaSampler, dict read (real)",
            lambda: nullcontext(CudaSampler(f"cuda:{index}", stats=torch._C._cuda_memoryStats)),
        )
        yield "CudaSampler, native read (real)", lambda: nullcontext(CudaSampler(f"cuda:{index}"))


class simulated:
    """The runner's CUDA sampler inside a simulated GPU that has started CUDA."""

    def __init__(self, gpu: str) -> None:
        from gpu_mem_track.simgpu import simulated_gpu

        self._context = simulated_gpu(gpu)

    def __enter__(self) -> Any:
        self._context.__enter__()
        torch.empty(1, device="cuda")
        return CudaSampler("cuda:0", reader=NoReader())

    def __exit__(self, *exc: object) -> None:
        self._context.__exit__(*exc)


def time_lines(sampler: Any, iterations: int, folder: Path, sink: Any = None) -> float:
    """Seconds for the workload traced with ``sampler`` (timeline written to ``folder``),
    through the native line sink module ``sink`` (None: the Python path)."""
    timeline = TimelineWriter(folder / "timeline.csv")
    profiler = LineProfiler(sampler, timeline=timeline, line_sink=sink)
    engine = best_engine(profiler, wants)
    started = time.thread_time()
    engine.start()
    try:
        workload(iterations)
    finally:
        engine.stop()
        profiler.finish()
        timeline.close()
    return time.thread_time() - started


def time_plain(iterations: int) -> float:
    started = time.thread_time()
    workload(iterations)
    return time.thread_time() - started


def time_sample(sampler: Any, calls: int) -> float:
    """Nanoseconds (thread CPU time) per ``sampler.sample()``."""
    sample = sampler.sample
    sample()
    started = time.thread_time()
    for _ in range(calls):
        sample()
    return (time.thread_time() - started) / calls * 1e9


def sinks() -> list[tuple[str, Any]]:
    """(name, module) of the line sinks to time: Python, and the native one where built."""
    module = linesink.module()
    return [("python", None)] + ([("native", module)] if module is not None else [])


def measure(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    rows = []
    for (name, make), (sink_name, sink) in itertools.product(samplers(args), sinks()):
        per_line, per_sample, reader, error = [], [], "", ""
        iterations = args.iterations // SLOW_SHARE if "simulated" in name else args.iterations
        try:
            for _ in range(args.repeats):
                with make() as sampler:
                    plain = time_plain(iterations)
                    traced = time_lines(sampler, iterations, folder, sink)
                    per_line.append((traced - plain) / (iterations * LINES_PER_ITERATION) * 1e6)
                    per_sample.append(time_sample(sampler, 2 * iterations))
                    reader = getattr(sampler, "stats_reader", "")
        except Exception as error_:  # a sampler that cannot run here: say why, go on
            error = f"{type(error_).__name__}: {error_}"
        rows.append(
            {
                "sampler": name,
                "sink": sink_name,
                "stats_reader": reader,
                "lines_per_round": iterations * LINES_PER_ITERATION,
                "us_per_line": statistics.median(per_line) if per_line else None,
                "us_per_line_min": min(per_line) if per_line else None,
                "us_per_line_runs": [round(v, 3) for v in per_line],
                "ns_per_sample": statistics.median(per_sample) if per_sample else None,
                "error": error,
                "native_status": cudastats.status().replace(str(Path.home()), "~")
                if name.endswith("(real)")
                else "",
            }
        )
        print(rows[-1], file=sys.stderr)
    return rows


def native_status() -> str:
    """``cudastats.status()`` with the home folder written ``~``."""
    return cudastats.status().replace(str(Path.home()), "~")


def report(args: argparse.Namespace, rows: list[dict[str, Any]], env: dict[str, Any], status: str) -> str:
    engine = "sys.monitoring" if sys.version_info >= (3, 12) else "sys.settrace"
    table = [
        [
            row["sampler"],
            row["sink"],
            row["stats_reader"] or "-",
            "-" if row["us_per_line"] is None else f"{row['us_per_line']:.2f}",
            "-" if row["us_per_line_min"] is None else f"{row['us_per_line_min']:.2f}",
            "-" if row["ns_per_sample"] is None else f"{row['ns_per_sample']:.0f}",
            row["error"] or "",
        ]
        for row in rows
    ]
    lines = [
        "# The runner's cost per traced line",
        "",
        f"`{env['command']}` at commit {env['commit']}, {env['date_utc']}: Python {env['python']} "
        f"({engine}), torch {env['torch']}, {env['cpu_count']} CPUs ({env['machine']}), "
        f"{args.iterations * LINES_PER_ITERATION:,} traced lines a round (the simulated GPU's row: "
        f"{args.iterations * LINES_PER_ITERATION // SLOW_SHARE:,}), {args.repeats} rounds.",
        "",
        *markdown_table(
            ["sampler", "line sink", "read", "us per line (median)", "(min)", "ns per sample() (median)"]
            + ["not run"],
            table,
        ),
        "",
        "The line's cost is the whole runner's (engine callback, profiler, timeline row, memory read) "
        "against the untraced workload, in the thread's CPU time. The stub rows time only the Python "
        "side of each read; "
        f"torch building its statistics dict costs {H200_DICT_US} us a call on an H200 on top of the "
        "dict row, where the native read returns the five figures from one C++ call.",
        "",
        "The line sink: `python`, the profiler's Python path; `native`, its C++ line sink "
        "(`gpu_mem_track/native/line_sink.cpp`), which gives the same records and timeline.",
        "",
        f"The native line sink here: {linesink.status().replace(str(Path.home()), '~')}",
        f"The native CUDA reader here, before the rows ran: {status}",
        *(f"After the row {row['sampler']}: {row['native_status']}" for row in rows if row["native_status"]),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if torch.cuda.is_available() and build.plan(name=build.CUDA_MODULE).missing == "":
        build.build(quiet=False, name=build.CUDA_MODULE)
    if build.plan(name=build.LINE_MODULE).missing == "":
        build.build(quiet=False, name=build.LINE_MODULE)
    status = native_status()
    with tempfile.TemporaryDirectory() as folder:
        rows = measure(args, Path(folder))
    env = environment()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(args, rows, env, status))
    data = {"environment": env, "native_status": status, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
