"""``run``: a script under the line profiler (``runner.run``)."""

from __future__ import annotations

import argparse

from . import Command, count

__all__ = ["COMMAND"]


def prepare_parser(run: argparse.ArgumentParser) -> None:
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
        "--top", type=count, default=5, metavar="N", help="lines in the final summary (default: 5)"
    )
    run.add_argument(
        "--activations",
        action="store_true",
        help="record the tensors autograd saves for backward, so censuses count them as "
        "activations with the line that saved them",
    )
    run.add_argument(
        "--all-ranks",
        action="store_true",
        help="under torchrun, every rank prints its summary (default: rank 0 only)",
    )
    run.add_argument(
        "--rank-wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="under torchrun, how long rank 0 waits for the other ranks to end before it "
        "prints the ranks table (default: 10)",
    )


def run(args: argparse.Namespace) -> int:
    """Check everything, then run the script; its exit code is ours."""
    from ..errors import UsageError
    from ..runner.run import RunOptions, execute, prepare
    from ..units import parse_bytes

    try:
        threshold = None if args.census_threshold is None else parse_bytes(args.census_threshold)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.rank_wait < 0:
        raise UsageError(f"--rank-wait takes seconds >= 0, not {args.rank_wait}")
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
        all_ranks=args.all_ranks,
        rank_wait=args.rank_wait,
    )
    return execute(prepare(options)).exit_code


COMMAND = Command(
    name="run",
    help="run a script and profile its memory line by line",
    description="Run SCRIPT as __main__ (with its own sys.argv) and record, for every line of it "
    "(and of what --include names) that runs: memory after the line, increment, the peak while "
    "it ran and hits. Writes reports/<run>/report.txt, lines.csv, timeline.csv and meta.json, "
    "also when the script fails or is interrupted, and exits with the script's exit code "
    "(1 after an uncaught exception, 130 after Ctrl-C, 2 when it could not start). Memory is "
    "the CUDA caching allocator's allocated bytes on a GPU, the process's RSS on the CPU. "
    "Under torchrun every rank writes reports/<launch>/rank<k>/ (one launch folder for all "
    "ranks, with ranks.csv and report.txt comparing them), measures its own device, and only "
    "rank 0 prints.",
    prepare_parser=prepare_parser,
    run=run,
)
