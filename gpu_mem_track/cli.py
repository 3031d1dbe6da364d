"""Command line: ``python -m gpu_mem_track <command>``; each command is one library call.

Exit codes: 0 success, 1 the command could not run here (no CUDA for the probe),
2 a usage mistake (bad option, missing or unreadable file).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m gpu_mem_track`` parser, one subcommand per library call."""
    parser = argparse.ArgumentParser(
        prog="python -m gpu_mem_track",
        description="Where GPU memory goes: line by line, tensor by tensor, byte by byte.",
    )
    parser.add_argument("--version", action="version", version=f"gpu_mem_track {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)

    probe = commands.add_parser(
        "probe",
        help="measure what the CUDA context, cuBLAS and cuDNN cost on a GPU",
        description="Measure, in a fresh subprocess, driver-level memory before CUDA starts, "
        "after the context exists, after the first cuBLAS matmul and after the first cuDNN "
        "convolution, and print the framework cost of each part. Needs CUDA and nvidia-ml-py.",
    )
    probe.add_argument("--device", default="cuda:0", help="CUDA device to probe (default: cuda:0)")
    probe.add_argument("--json", action="store_true", help="print the result as JSON")

    show = commands.add_parser(
        "show",
        help="print a CSV report as the text report",
        description="Render a CSV report written by MemTracker as the text report.",
    )
    show.add_argument("report", type=Path, help="CSV report (reports/<run>.csv)")
    show.add_argument("--totals-only", action="store_true", help="leave out the changed tensor groups")
    _add_compare(commands)
    _add_plot(commands)
    from .estimator.cli import add_commands as add_estimate_commands

    add_estimate_commands(commands)
    from .snapshots.command import add_parser as add_snapshot_parser

    add_snapshot_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "probe":
            return _probe(args.device, args.json)
        if args.command == "compare":
            return _compare(args.a, args.b, args.by, args.top)
        if args.command == "plot":
            return _plot(args.runs, args.output, args.title)
        if args.command in ("estimate", "batch-size"):
            from .estimator.cli import run_command

            return run_command(args, _fail)
        if args.command == "snapshot":
            from .snapshots.command import run as run_snapshot

            return run_snapshot(args)
        return _show(args.report, not args.totals_only)
    except BrokenPipeError:
        return 0


def _add_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="run a script and profile its memory line by line",
        description="Run SCRIPT as __main__ (with its own sys.argv) and record, for every line of it "
        "(and of what --include names) that runs: memory after the line, increment, the peak while "
        "it ran and hits. Writes reports/<run>/report.txt, lines.csv, timeline.csv and meta.json, "
        "also when the script fails or is interrupted, and exits with the script's exit code "
        "(1 after an uncaught exception, 130 after Ctrl-C, 2 when it could not start). Memory is "
        "the CUDA caching allocator's allocated bytes on a GPU, the process's RSS on the CPU.",
    )
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    run.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATH_OR_MODULE",
        help="also trace the lines of this file, folder, module or package (repeatable); "
        "torch and the standard library are never traced",
    )
    run.add_argument("--out-dir", default="reports", help="folder of run folders (default: reports)")
    run.add_argument("--run-name", help="name of the run folder (default: <script>-<date>-<time>)")
    run.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda or cuda:N (default: cuda:0 when the NVIDIA driver shows a GPU, else cpu)",
    )
    run.add_argument(
        "--census-threshold",
        metavar="SIZE",
        help="after a line that grows memory by at least SIZE (e.g. 64MiB), take a census of "
        "live tensors so the report names them (default: never)",
    )
    run.add_argument(
        "--engine",
        choices=("auto", "monitoring", "settrace"),
        default="auto",
        help="line events from sys.monitoring (Python 3.12+) or sys.settrace (default: auto, "
        "the first where available)",
    )
    run.add_argument(
        "--top", type=_count, default=5, metavar="N", help="lines in the final summary (default: 5)"
    )
    run.add_argument(
        "--activations",
        action="store_true",
        help="record the tensors autograd saves for backward, so censuses count them as "
        "activations with the line that saved them",
    )


def _run(args: argparse.Namespace) -> int:
    from .errors import UsageError
    from .runner.run import RunOptions, execute, prepare
    from .units import parse_bytes

    try:
        threshold = None if args.census_threshold is None else parse_bytes(args.census_threshold)
        options = RunOptions(
            script=args.script,
            args=tuple(args.args),
            out_dir=args.out_dir,
            run_name=args.run_name,
            include=tuple(args.include),
            device=args.device,
            census_threshold=threshold,
            engine=args.engine,
            top=args.top,
            activations=args.activations,
        )
        prepared = prepare(options)
    except (UsageError, ValueError) as exc:
        return _fail(str(exc), 2)
    return execute(prepared)


def _probe(device: str, as_json: bool) -> int:
    import torch

    from .tracker.probe import ProbeError, run_probe
    from .tracker.render import render_probe

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        return _fail(f"not a device: {device!r} (examples: cuda, cuda:1)", 2)
    if parsed.type != "cuda":
        return _fail(f"the probe measures CUDA devices, not {device!r}", 2)
    try:
        result = run_probe(device)
    except ProbeError as exc:
        return _fail(str(exc), 1)
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n" if as_json else render_probe(result))
    return 0


def _show(report: Path, detail: bool) -> int:
    from .tracker.csvlog import read_stamps
    from .tracker.render import render_stamps

    try:
        stamps = read_stamps(report)
    except FileNotFoundError:
        return _fail(f"no such report: {report}", 2)
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(f"cannot read {report}: {exc}", 2)
    except (ValueError, KeyError) as exc:
        return _fail(f"{report} is not a gpu_mem_track CSV report ({exc})", 2)
    sys.stdout.write(render_stamps(stamps, detail))
    return 0


def _add_compare(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser(
        "compare",
        help="two runs side by side, largest differences first",
        description="Compare two runs (runner folders, their lines.csv or timeline.csv, or MemTracker "
        "CSVs) per source line, per function or per track() label, largest difference first. Lines "
        "match by file name, function and code text, so edits that shift line numbers still match.",
    )
    compare.add_argument(
        "a", type=Path, help="run A: reports/<run>/, its lines.csv or timeline.csv, or reports/<run>.csv"
    )
    compare.add_argument("b", type=Path, help="run B, compared with A (differences are B minus A)")
    compare.add_argument(
        "--by",
        choices=("line", "function", "label"),
        help="what to match: source lines, functions (increments summed) or track() labels "
        "(default: line when both runs have per-line records, else label)",
    )
    compare.add_argument(
        "--top",
        type=_count,
        default=20,
        metavar="N",
        help="show the N largest differences (default: 20; 0: all)",
    )


def _add_plot(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser(
        "plot",
        help="draw memory over time for one or more runs (needs matplotlib)",
        description="Draw memory over time like mprof plot: allocated (or RSS / tensor bytes on the CPU), "
        "reserved and driver memory where recorded, the peak marked, track() labels annotated; several "
        'runs overlay. Needs matplotlib: pip install "gpu_mem_track[plot]".',
    )
    plot.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="reports/<run>/, its timeline.csv, or reports/<run>.csv",
    )
    plot.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("timeline.png"),
        help="image to write; the format follows the suffix: png, svg, pdf (default: timeline.png)",
    )
    plot.add_argument("--title", help="chart title (default: the runs' names)")


def _compare(a: Path, b: Path, by: str | None, top: int) -> int:
    from .errors import UsageError
    from .runs.compare import compare_files, render_comparison

    try:
        comparison = compare_files(a, b, by)
    except UsageError as exc:
        return _fail(str(exc), 2)
    sys.stdout.write(render_comparison(comparison, top))
    return 0


def _plot(runs: list[Path], output: Path, title: str | None) -> int:
    from .errors import UsageError
    from .runs.plot import PlotUnavailable, plot_files

    try:
        written = plot_files(runs, output, title)
    except PlotUnavailable as exc:
        return _fail(str(exc), 1)
    except UsageError as exc:
        return _fail(str(exc), 2)
    print(f"wrote {written}")
    return 0


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a count >= 0: {text!r}")
    return value


def _fail(message: str, code: int) -> int:
    print(f"gpu_mem_track: {message}", file=sys.stderr)
    return code
