"""``fit``: what would make a script fit on a simulated GPU (``fit.api.fit``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import Command, count, positive, print_result

if TYPE_CHECKING:
    from ..advisor.api import FitInterrupted
    from ..advisor.records import FitResult
    from ..ranks import RankInfo

__all__ = ["COMMAND"]


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"not a fraction in (0, 1]: {text!r}")
    return value


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("gpu", help="the simulated GPU: a name the gpus command lists, or SIZE:smXY")
    parser.add_argument("script", help="the Python script (our options go before it)")
    rest = parser.add_argument(
        "args", nargs=argparse.REMAINDER, help="arguments passed to the script, verbatim"
    )
    rest.required = False
    parser.add_argument(
        "--threshold",
        type=_fraction,
        default=0.9,
        metavar="F",
        help="a run whose peak reserved is above F of the capacity counts as too tight, and the levers "
        "are tried (default: 0.9)",
    )
    parser.add_argument(
        "--levers",
        metavar="A,B",
        help="the levers of run --lever to try, comma-separated (default: all: expandable, grads-to-none, "
        "no-foreach, fused, gc-threshold, autocast, checkpoint; tried in that order, cheapest first)",
    )
    parser.add_argument(
        "--batch-arg",
        metavar="ARG",
        help="the script's argument that sets the batch: an option (--batch-arg=--batch_size for "
        "--batch_size=32 or --batch_size 32 in the script's arguments; write it with =) or the index of a "
        "positional argument, counted from 0 (the first argument after the script: --batch-arg 0 for "
        "train.py 32 1024, which the script reads as sys.argv[1]); each row then gets the largest batch "
        "that fits, found by simulated trials",
    )
    parser.add_argument(
        "--max-batch",
        type=positive,
        metavar="N",
        help="the largest batch the search of --batch-arg tries (at least the script's batch)",
    )
    parser.add_argument(
        "--jobs", type=positive, metavar="N", help="trials run at once (default: the cores available)"
    )
    parser.add_argument(
        "--out-dir",
        default="reports",
        help="folder under which fit-<script>-<date>-<time>/ keeps each trial's run folder "
        "(default: reports)",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=positive,
        metavar="N",
        help="simulate the script's ranks on N GPUs as torchrun would start them (rank 0 and the last "
        "rank, each alone), and try the distributed levers (zero, fsdp2 and its options), the best of them "
        "with autocast and checkpoint when none fits, and other world sizes; figures per GPU. Under "
        "torchrun, WORLD_SIZE gives N",
    )
    parser.add_argument(
        "--accum-arg",
        metavar="ARG",
        help="with --nproc-per-node and --batch-arg: the script's argument that sets the gradient "
        "accumulation steps (written as --batch-arg); where a row fits only at a smaller batch per GPU, one "
        "trial runs at that batch with the accumulation raised to keep the samples per step",
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON instead of the table")
    parser.add_argument("--html", metavar="PATH", help="also write the answer as an HTML page to PATH")
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATH_OR_MODULE",
        help="passed to each trial's run: also trace this file, folder, module or package (repeatable)",
    )
    parser.add_argument(
        "--max-iterations",
        type=count,
        metavar="N",
        help="passed to each trial's run: leave a loop after N iterations",
    )
    parser.add_argument(
        "--max-seconds", type=float, metavar="S", help="passed to each trial's run: stop it after S seconds"
    )
    parser.add_argument(
        "--run-to-end",
        action="store_true",
        help="passed to each trial's run: do not stop the loop once its memory is steady",
    )
    parser.add_argument(
        "--end-script",
        action="store_true",
        help="passed to each trial's run: end the script where its loop is stopped",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "monitoring", "settrace"),
        default="auto",
        help="passed to each trial's run: where line events come from (default: auto)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the trials, print the answer (or JSON), write the page; the exit code is
    ``FitResult.exit_code`` (0 fits as asked, 3 only with a smaller batch, 1 nothing fits).
    Under torchrun only rank 0 does (see ``EPILOG``)."""
    from ..ranks import rank_info

    launch = rank_info()
    if launch is not None and not launch.is_first:
        return 0  # under torchrun rank 0 simulates every rank and answers; the others run nothing
    try:
        return _answer(args, launch)
    finally:
        from ..advisor.forked import close_server

        close_server()  # no process of fit outlives it


def _answer(args: argparse.Namespace, launch: RankInfo | None) -> int:
    """``run`` on the rank that answers (every run outside torchrun)."""
    from ..advisor.api import FitInterrupted
    from ..advisor.render import render_fit
    from ..errors import UsageError

    if args.html and not Path(args.html).resolve().parent.is_dir():  # both before any trial runs
        raise UsageError(f"--html {args.html}: no such folder for the page")
    if args.html and Path(args.html).is_dir():
        raise UsageError(f"--html {args.html}: a folder, not a page to write")

    def progress(line: str) -> None:  # one write per line: trials end in several threads
        sys.stderr.write(f"gpu_mem_track fit: {line}\n")
        sys.stderr.flush()

    nproc = _world(args, None if launch is None else launch.world_size)
    if nproc is not None:
        try:
            with _signals_interrupt():
                return _distributed(args, nproc, progress)
        except FitInterrupted as stop:
            _say_interrupted(stop)
            return 128 + stop.signum
    if args.accum_arg is not None:
        raise UsageError("--accum-arg is for --nproc-per-node")
    try:
        with _signals_interrupt():
            result = _fit(args, progress)
    except FitInterrupted as stop:
        _say_interrupted(stop)
        return 128 + stop.signum
    print_result(result, args.json, render_fit)
    if args.html:
        from ..advisor.page import write_fit_page

        print(f"Wrote {write_fit_page(result, args.html)}", file=sys.stderr)
    return result.exit_code


def _fit(args: argparse.Namespace, progress: Callable[[str], None]) -> FitResult:
    from ..advisor.api import fit

    return fit(args.script, tuple(args.args), levers=args.levers, progress=progress, **_shared(args))


def _shared(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords ``fit`` and ``fit_distributed`` both take, from the options."""
    return {
        "gpu": args.gpu,
        "batch_arg": args.batch_arg,
        "threshold": args.threshold,
        "jobs": args.jobs,
        "out_dir": args.out_dir,
        "max_batch": args.max_batch,
        "include": tuple(args.include),
        "max_iterations": args.max_iterations,
        "max_seconds": args.max_seconds,
        "run_to_end": args.run_to_end,
        "end_script": args.end_script,
        "engine": args.engine,
    }


class _Signalled(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP while fit runs: unwinds it like Ctrl-C (``fit`` then
    stops every trial and raises ``FitInterrupted``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP (those at their default or
    Python's, not one ignored as under ``nohup``) raise ``_Signalled`` in the main thread,
    once: a second signal while the trials are being stopped is ignored, so the stop
    finishes. The handlers before are put back after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not raised:
            raised.append(signum)
            raise _Signalled(signum)

    replaced = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            replaced[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, before in replaced.items():
            signal.signal(signum, before)


def _say_interrupted(stop: FitInterrupted) -> None:
    """Which trial folders are complete, on standard error."""
    import signal

    name = signal.Signals(stop.signum).name if stop.signum in iter(signal.Signals) else str(stop.signum)
    lines = [f"interrupted ({name}): every trial stopped, no process left"]
    if stop.complete:
        lines.append(f"complete trial folders ({len(stop.complete)}): {', '.join(stop.complete)}")
    else:
        lines.append("no trial was complete")
    if stop.stopped:
        names = ", ".join(stop.stopped)
        lines.append(f"stopped, not complete ({len(stop.stopped)}): {names} (under {stop.folder}/)")
    if stop.not_started:
        lines.append(f"not started ({len(stop.not_started)}): {', '.join(stop.not_started)}")
    for line in lines:
        sys.stderr.write(f"gpu_mem_track fit: {line}\n")
    sys.stderr.flush()


def _world(args: argparse.Namespace, launched: int | None) -> int | None:
    """The ranks asked for: --nproc-per-node, else the world size of the torchrun launch
    fit runs under, ``launched`` (None: one GPU)."""
    if args.nproc_per_node is not None:
        return int(args.nproc_per_node)
    return launched if launched is not None and launched > 1 else None


def _distributed(args: argparse.Namespace, nproc: int, progress: object) -> int:
    """``fit --nproc-per-node`` (``advisor.distributed``)."""
    from ..advisor.distributed import fit_distributed
    from ..advisor.worldrender import render_distributed

    if args.levers:
        from ..errors import UsageError

        raise UsageError("--nproc-per-node tries the distributed levers itself: --levers is for one GPU")
    result = fit_distributed(
        args.script,
        tuple(args.args),
        nproc=nproc,
        accum_arg=args.accum_arg,
        progress=progress,  # type: ignore[arg-type]
        **_shared(args),
    )
    print_result(result, args.json, render_distributed)
    if args.html:
        from ..advisor.worldpage import write_distributed_page

        print(f"Wrote {write_distributed_page(result, args.html)}", file=sys.stderr)
    return result.exit_code


COMMAND = Command(
    name="fit",
    help="what would make a script fit on a simulated GPU",
    description="Run SCRIPT with ARGS on the simulated GPU (see run --simulate), each trial in its own run "
    "folder. If its peak reserved is within --threshold of the capacity (the GPU's memory less the CUDA "
    "context and libraries), say so with the headroom and the line of the peak. Otherwise run it with each "
    "lever of run --lever alone, in parallel, then combinations until one fits. The answer leads with what "
    "to do: the cheapest change that fits; or, when nothing fits at your batch (with --batch-arg), the "
    "change that reaches the largest batch (on a tie the cheapest) and, where the script has a "
    "gradient-accumulation argument, how to keep your batch (batch 16 x 2 accumulation steps). Then one "
    "table, best first: the change, fits (yes, tight, no), the largest batch that fits, the headroom or "
    "the shortfall, the cost; then the details (peaks, the line of the peak or of the out-of-memory, the "
    "change to make in the script). A lever that cannot change anything in this script (autocast on a "
    "model that already computes in bf16/fp16, an optimizer lever the optimizer already has) is listed "
    "under 'not tried' with the reason, and not combined. Every 'fits' is a simulated run that completed "
    "within the capacity.",
    prepare_parser=prepare_parser,
    run=run,
)

#: The exit codes and what an interrupt does, under the options in --help.
EPILOG = (
    "Exit codes: 0 it fits as asked (as it is, or with the change recommended); 3 it fits only "
    "with a smaller batch (with --batch-arg; the answer names the change and the batch); 1 nothing tried "
    "fits at any batch, or the script failed for another reason; 2 a usage mistake. Ctrl-C, SIGTERM or a "
    "closed terminal stop every trial; fit then says which trial folders are complete and exits 130, "
    "143 or 129. Under torchrun, rank 0 runs the trials, answers and exits with these codes (torchrun "
    "reports any but 0 as a failure, with its own code 1); the other ranks run nothing and exit 0."
)
