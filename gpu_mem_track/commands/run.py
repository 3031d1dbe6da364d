"""``run``: a script under the line profiler (``runner.run``)."""

from __future__ import annotations

import argparse
import sys

from ..levers.catalog import LEVERS, SHARDING_LEVERS
from . import Command, count, report

__all__ = ["COMMAND"]


def prepare_parser(run: argparse.ArgumentParser) -> None:
    run.add_argument("script", help="the Python script to run (our options go before it)")
    rest = run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script, verbatim")
    rest.required = False  # Python < 3.13 marks it required: "required: script, args" without a script
    run.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATH_OR_MODULE",
        help="also trace the lines of this file, folder, module or package (repeatable); "
        "torch, the standard library and gpu_mem_track are never traced (naming them is an error)",
    )
    run.add_argument("--out-dir", default="reports", help="folder of run folders (default: reports)")
    run.add_argument("--run-name", help="name of the run folder (default: <script>-<date>-<time>)")
    run.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda or cuda:N (default: cuda:0 when the NVIDIA driver shows a GPU, else cpu; "
        "under torchrun, auto and cuda mean each rank's own GPU, cuda:N pins one)",
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
        "--top", type=count, default=5, metavar="N", help="lines in the final summary (default: 5; 0: all)"
    )
    run.add_argument(
        "--memory",
        choices=("auto", "rss", "heap", "tensors"),
        default="auto",
        help="what to measure on the CPU: rss, the process's resident set size (auto); heap, "
        "the C heap in use (tensors included; freed tensors subtract at once; glibc only; each read "
        "walks malloc's free lists, slow in a fragmented heap); or tensors, the bytes of live CPU "
        "tensor storages made by torch ops in the script's thread, with exact peaks (imports torch "
        "before the script; adds a Python call to every torch op)",
    )
    run.add_argument(
        "--activations",
        action="store_true",
        help="record the tensors autograd saves for backward, so censuses count them as "
        "activations with the line that saved them",
    )
    run.add_argument(
        "--html",
        action="store_true",
        help="also write report.html (see the html command) into the run folder",
    )
    run.add_argument(
        "--snapshot",
        action="store_true",
        help="CUDA only: record the allocator's history while the script runs (from when it starts "
        "CUDA; torch is imported first), keep it as snapshot.pickle in the run folder with its "
        "analysis (snapshot_lines.csv, snapshot.json, snapshot_report.txt), and take every line's "
        "exact peak from it",
    )
    run.add_argument(
        "--snapshot-entries",
        type=count,
        metavar="N",
        help="with --snapshot: trace entries kept, the last N (default: 100000; each costs host "
        "memory, up to a few KB with its stack); lines that ran before them keep the runner's peak",
    )
    run.add_argument(
        "--simulate",
        metavar="GPU",
        help="run the script unchanged on a simulated GPU: a name listed by the gpus command "
        "(case-insensitive, e.g. A100-40GB; a model alone, e.g. h100, where one GPU has it) "
        "or SIZE:smXY (e.g. 24GiB:sm86). CUDA tensors get shapes, "
        "no data, and memory from the caching-allocator model of that GPU; once its loop's memory is "
        "steady the loop is left as a break would and the script goes on after it (see --run-to-end, "
        "--end-script). Under torchrun each rank runs on its own "
        "simulated GPU, in torch's fake process group (collectives move no data)",
    )
    run.add_argument(
        "--lever",
        action="append",
        default=[],
        metavar="NAME",
        help="apply this lever for the whole run, without editing the script (repeatable; CUDA runs, "
        f"real or --simulate): {', '.join(LEVERS)}; distributed (under torchrun): "
        f"{', '.join(SHARDING_LEVERS)}; meta.json's levers say what each did and the "
        "line to write in the script for it",
    )
    run.add_argument(
        "--max-iterations",
        type=count,
        metavar="N",
        help="leave a loop after N of its iterations, as a break would (the loop is found as the "
        "docs/simulate.md's 'Long scripts' says; see --end-script); the reports say where and how many "
        "iterations were skipped",
    )
    run.add_argument(
        "--max-seconds",
        type=float,
        metavar="S",
        help="stop the script after S seconds of wall time; the reports say where it stopped",
    )
    run.add_argument(
        "--run-to-end",
        action="store_true",
        help="with --simulate: do not stop the loop once its memory is steady",
    )
    run.add_argument(
        "--end-script",
        action="store_true",
        help="with --simulate or --max-iterations: when a loop is stopped, end the whole script there "
        "(the code after the loop does not run) instead of leaving the loop as a break would",
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
    from ..runner.options import RunOptions
    from ..runner.run import execute, prepare
    from ..units import parse_bytes

    try:
        threshold = None if args.census_threshold is None else parse_bytes(args.census_threshold)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.snapshot_entries is not None and not args.snapshot:
        raise UsageError("--snapshot-entries only applies with --snapshot")
    entries = {} if args.snapshot_entries is None else {"snapshot_entries": args.snapshot_entries}
    if args.rank_wait < 0:
        raise UsageError(f"--rank-wait takes seconds >= 0, not {args.rank_wait}")
    if args.run_to_end and args.simulate is None:
        raise UsageError("--run-to-end only applies with --simulate")
    if args.end_script and args.simulate is None and args.max_iterations is None:
        raise UsageError("--end-script only applies with --simulate or --max-iterations")
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
        memory=args.memory,
        snapshot=args.snapshot,
        all_ranks=args.all_ranks,
        rank_wait=args.rank_wait,
        simulate=args.simulate,
        max_iterations=args.max_iterations,
        max_seconds=args.max_seconds,
        run_to_end=args.run_to_end,
        end_script=args.end_script,
        levers=tuple(args.lever),
        **entries,
    )
    result = execute(prepare(options))
    if args.html:  # the script's exit code stays ours even if the page cannot be written
        from ..html.page import write_report

        try:
            page = write_report([result.folder], result.folder / "report.html")
            print(f"Wrote {page}", file=sys.stderr)  # as the html command says it
        except UsageError as exc:
            report(f"no report.html: {exc}")
    return result.exit_code


COMMAND = Command(
    name="run",
    help="run a script and profile its memory line by line",
    description="Run SCRIPT as __main__ (with the sys.argv `python SCRIPT ARGS` gives it) and "
    "record, for every line of it (and of what --include names) that runs: memory after the line, "
    "net increment, rise (its peak above its start), the peak while it ran and hits. Writes "
    "reports/<run>/report.txt, lines.csv, timeline.csv and meta.json, also when the script fails, "
    "is interrupted or receives SIGTERM/SIGHUP, and exits with the script's exit code (1 after an "
    "uncaught exception, 130 after Ctrl-C, 128+N after signal N, 2 when it could not start). "
    "Memory is the CUDA caching allocator's allocated bytes on a GPU, the process's RSS on the "
    "CPU (see --memory). With --snapshot (CUDA) the run folder also keeps "
    "snapshot.pickle, and line peaks come from its trace. "
    "With --simulate GPU the script runs on a simulated GPU (no GPU needed): the report adds what the "
    "simulation could not know and where the GPU would run out of memory; once its loop's memory is "
    "steady (or at --max-iterations) the loop is left as a break would and the script goes on after it "
    "(--end-script ends the script there instead); --max-seconds ends the script (exit code 0; the "
    "report says where and how many iterations were skipped). "
    "With --lever NAME (repeatable; CUDA, real or simulated) the script runs with that change made "
    "for it, unedited; meta.json's levers say what each did, what it costs and the line to write. "
    "Under torchrun every rank writes reports/<launch>/rank<k>/ (one launch folder for all "
    "ranks, with ranks.csv and report.txt comparing them), measures its own device, and only "
    "rank 0 prints.",
    prepare_parser=prepare_parser,
    run=run,
)
