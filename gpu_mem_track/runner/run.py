"""``python -m gpu_mem_track run``: a whole script, line by line, with no code changes.

The sequence: check everything that can be checked before the script runs (``prepare``,
``UsageError`` on a user mistake; every output path made absolute), then ``execute``:
run the script as ``__main__`` under the tracing engine (``launch.run_script``), write
every report (also after an exception, ``sys.exit``, Ctrl-C, SIGTERM or SIGHUP), and
return the script's exit code. Under torchrun (``ranks.rank_info``) the run folder is
``<launch>/rank<k>/`` and each rank rebuilds the launch's ranks table at its end
(``ranktable.report_launch``).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Any, TextIO

from .._version import __version__
from ..devices import Device
from ..errors import UsageError
from ..outputs import claim_folder, safe_name
from ..ranks import rank_folder, rank_info
from ..runfolder.files import RunFolder, TimelineWriter, replace_text, write_lines, write_meta
from ..runfolder.ranktable import report_launch
from ..runfolder.records import RunInfo
from .checks import (
    check_budgets,
    check_engine,
    check_memory,
    check_out_dir,
    check_snapshot,
    library_dirs,
    readable_script,
    resolve_device,
    resolve_includes,
)
from .history import HistoryRecorder
from .launch import dies_of_signals_after_unwinding, run_script, runner_objects_frozen
from .options import PreparedRun, RunOptions
from .profiler import LineProfiler
from .result import RunResult
from .samplers import CudaSampler, HeapSampler, RssSampler, Sampler
from .session import RunSession
from .simulate import check_levers, check_simulate, simulation, simulation_info, stop_rule
from .steady import LoopWatch
from .tracer import best_engine

if TYPE_CHECKING:  # imported by a --snapshot run only: it loads the allocator's model (0.1 s)
    from .recording import SnapshotRun

__all__ = ["RunOptions", "PreparedRun", "prepare", "execute", "run"]


def prepare(options: RunOptions, environ: Mapping[str, str] | None = None) -> PreparedRun:
    """Check the script, ``--include`` and the output folder, and create the run folder.

    Raises ``UsageError`` (one line naming the problem) for a missing or unreadable
    script, an unknown ``--include``, a bad device, an engine this Python lacks,
    ``--activations`` without torch, an output folder that cannot be written, or a
    launcher environment (``RANK``, ``WORLD_SIZE``) that makes no sense, an unknown
    ``--simulate`` GPU or one with ``--device cpu``, or a budget below 1. ``environ``:
    the environment to read the rank from (default ``os.environ``).
    """
    script = readable_script(options.script)
    rank = rank_info(environ)
    files, dirs = resolve_includes(options.include, script)
    gpu = check_simulate(options, rank)
    check_budgets(options.max_iterations, options.max_seconds)
    device = Device("cuda", 0) if gpu is not None else resolve_device(options.device)
    check_memory(options.memory, device)
    check_levers(options, device)
    check_engine(options.engine)
    if options.activations and importlib.util.find_spec("torch") is None:
        raise UsageError("--activations needs torch, which is not installed here")
    if options.snapshot:
        check_snapshot(options, device)
    # Absolute now: a script that calls os.chdir() must not move our reports.
    out_dir = Path(options.out_dir).absolute()
    check_out_dir(out_dir, options.out_dir)
    traced = frozenset({str(script / "__main__.py" if script.is_dir() else script), *files})
    if rank is not None:
        folder = RunFolder(rank_folder(out_dir, options.run_name, script, rank, environ))
        follow = device.is_cuda and options.device in ("auto", "cuda")
        device = Device("cuda", rank.local_rank) if follow else device
        return PreparedRun(options, script, folder, traced, dirs, device, rank, follow, gpu=gpu)
    name = safe_name(options.run_name or f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    folder = RunFolder(claim_folder(out_dir, name))
    return PreparedRun(options, script, folder, traced, dirs, device, gpu=gpu)


def run(options: RunOptions, stream: TextIO | None = None) -> int:
    """``prepare`` then ``execute``; returns the script's exit code."""
    return execute(prepare(options), stream).exit_code


def execute(
    prepared: PreparedRun,
    stream: TextIO | None = None,
    *,
    sampler: Sampler | None = None,
    history: HistoryRecorder | None = None,
) -> RunResult:
    """Run the prepared script under the line tracer, write the reports and return the
    :class:`~gpu_mem_track.runner.result.RunResult`: the script's exit code (0, the
    ``sys.exit`` code, 1 after an uncaught exception, 130 after Ctrl-C, 128 + N after
    signal N: 143 after SIGTERM, 129 after SIGHUP), the run's description, its line
    records, its automatic censuses and, with ``--snapshot``, how the snapshot was merged.
    ``prepared`` is not changed. ``sampler`` and ``history`` replace the memory readings
    and torch's history recorder (tests pass fakes)."""
    from ..levers.apply import applied_levers

    with dies_of_signals_after_unwinding():  # SIGTERM in the set-up: the except clause below
        try:
            with (
                runner_objects_frozen(),  # before torch is imported (launch.runner_objects_frozen)
                applied_levers(prepared.options.levers, prepared.gpu is not None) as levers,  # before CUDA
                simulation(prepared.gpu, prepared.rank) as gpu,  # before the sampler's first reading
            ):
                return _execute(prepared, stream, sampler, history, gpu, levers)
        except BaseException:
            if not prepared.folder.meta.exists():  # stopped before the script started (Ctrl-C or
                _abandon(prepared.folder)  # SIGTERM in torch's import): no empty run folder left
            raise


def _execute(
    prepared: PreparedRun, stream: TextIO | None, sampler: Sampler | None, history: Any, gpu: Any, levers: Any
) -> RunResult:
    options, folder, rank = prepared.options, prepared.folder, prepared.rank
    if sampler is None:
        sampler = _sampler(prepared)
    snapshot = _snapshot_run(prepared, sampler, history) if options.snapshot else None
    try:  # before the script starts, a folder we cannot write is the user's problem: exit 2
        timeline = TimelineWriter(folder.timeline)
    except OSError as exc:
        sampler.close()
        _abandon(folder)
        raise UsageError(f"cannot write reports to {folder.path}: {exc.strerror or exc}") from None
    session = RunSession(folder.path, sampler if prepared.follow_rank else prepared.device, timeline)
    profiler = LineProfiler(
        sampler,
        timeline,
        session.census,
        options.census_threshold,
        windows=snapshot.windows if snapshot else None,
        rank=None if rank is None else rank.rank,
    )
    session.profiler = profiler
    watch = _watch(options, profiler, sampler)
    engine = best_engine(watch or profiler, _wants(prepared), options.engine)
    info = _info(prepared, sampler.source, engine.name, profiler)
    _start_files(prepared, info, timeline, session, sampler)
    profiler.event_row("start", where=(str(prepared.script), "<module>", None))
    code = 1
    try:
        if snapshot is not None:
            snapshot.start()
        code = run_script(prepared, engine, session, pad=watch is not None and watch.leaves_loops)
        if code == 1 and watch is not None:
            _failed_after_leaving(watch.stopped)
    finally:
        session.close()
        profiler.finish()
        end_memory = sampler.sample()[0]
        profiler.event_row("end")
        timeline.close()
        records = profiler.records()
        if snapshot is not None:
            records = snapshot.finish(records)
        sampler.close()
        info = _finished(info, code, profiler, session, end_memory)
        info = _simulated(info, sampler, gpu, watch, levers)
        unwritten = {"timeline.csv": timeline.error.strerror or str(timeline.error)} if timeline.error else {}
        if session.write_error:
            unwritten["census.csv"] = session.write_error
        _write_reports(prepared, info, records, session, snapshot, stream, unwritten)
        session.script_globals.clear()
    merge = snapshot.result if snapshot is not None else None
    return RunResult(code, folder.path, info, tuple(records), tuple(session.censuses), merge)


def _watch(options: RunOptions, profiler: LineProfiler, sampler: Any) -> LoopWatch | None:
    """The stop rule between the engine and the profiler (None when nothing stops the run
    early; see ``steady``). On the CUDA allocator, real or simulated, an iteration counts
    only when it worked on the GPU (``LoopWatch``'s ``activity``: a fresh reading of the
    bytes allocated, the allocator's event count and its out-of-memory count); a loop left
    while autograd records nothing leaves no loop around it (``grad_enabled``)."""
    rule = stop_rule(options)
    if rule is None:
        return None
    activity = None
    if sampler.source == "cuda allocator":

        def activity() -> tuple[int, int, int]:
            return sampler.sample()[0], sampler.events, sampler.ooms()

    return LoopWatch(profiler, rule, profiler.high_marks, activity=activity, grad_enabled=_grad_enabled)


def _grad_enabled() -> bool:
    """Whether autograd records now (True before the script imported torch)."""
    torch = sys.modules.get("torch")
    return torch is None or bool(torch.is_grad_enabled())


def _failed_after_leaving(stopped: Any) -> None:
    """The script raised after the stop rule left a loop: say that the skipped
    iterations may be why (a name only they would have set, a branch only they take)."""
    if stopped is None or stopped.action != "left-loop":
        return
    print(
        f"gpu_mem_track: the script failed after the runner left the loop at {stopped.loop} "
        f"({stopped.iterations} iteration(s) run): the code after it may need what the skipped "
        "iterations would have done; --run-to-end runs them all, --end-script ends the script at "
        "the loop instead",
        file=sys.stderr,
    )


def _simulated(info: RunInfo, sampler: Any, gpu: Any, watch: LoopWatch | None, levers: Any) -> RunInfo:
    """The run's description with its reserved peak (CUDA), what the simulated GPU
    recorded (``--simulate``), where the stop rule stopped it and what each ``--lever`` did."""
    return replace(
        info,
        reserved_peak=getattr(sampler, "reserved_peak", None),
        stats_reader=_stats_reader(sampler, gpu),
        simulation=simulation_info(gpu) if gpu is not None else None,
        stopped=watch.stopped if watch is not None else None,
        levers=tuple(report.to_dict() for report in levers.reports()),
    )


def _stats_reader(sampler: Any, gpu: Any) -> str:
    """How a real GPU's allocator statistics were read when the run ended (the sampler's
    ``stats_reader``: ``"native"`` or ``"dict"``); "" on the CPU and a simulated GPU."""
    if sampler.source != "cuda allocator" or gpu is not None:
        return ""
    return str(getattr(sampler, "stats_reader", ""))


def _start_files(
    prepared: PreparedRun, info: RunInfo, timeline: TimelineWriter, session: RunSession, sampler: Any
) -> None:
    """``meta.json`` and, with ``--activations``, the census files: written before the
    script starts, so a failure is a ``UsageError`` (exit 2) that leaves no run folder."""
    try:
        write_meta(prepared.folder.meta, info)
        if prepared.options.activations:
            session.census_tracker(activations=True)
    except (OSError, UsageError) as exc:
        session.close()
        timeline.close()
        sampler.close()
        _abandon(prepared.folder)
        why = exc.strerror or exc if isinstance(exc, OSError) else exc
        raise UsageError(f"cannot write reports to {prepared.folder.path}: {why}") from None


def _abandon(folder: RunFolder) -> None:
    """Remove the run folder this run created (and the files it put there), if it can."""
    for path in folder.path.iterdir() if folder.path.is_dir() else ():
        try:
            path.unlink()
        except OSError:
            pass
    try:
        folder.path.rmdir()
    except OSError:
        pass


def _snapshot_run(prepared: PreparedRun, sampler: Any, history: HistoryRecorder | None) -> SnapshotRun:
    from .recording import SnapshotRun

    if history is None:
        from .history import TorchHistory

        history = TorchHistory()
    include = (str(prepared.script), *sorted(prepared.include_files), *prepared.include_dirs)
    return SnapshotRun(
        history, sampler, prepared.folder.path, prepared.device, prepared.options.snapshot_entries, include
    )


def _finished(
    info: RunInfo, code: int, profiler: LineProfiler, session: RunSession, end_memory: int
) -> RunInfo:
    """The run's description once the script ended."""
    where = f"{profiler.peak_at[0]}:{profiler.peak_at[1]}" if profiler.peak_at else ""
    return replace(
        info,
        ended=time.time(),
        exit_code=code,
        peak=profiler.peak,
        peak_at=where,
        peak_phase=session.peak_phase(profiler.peak),
        end_memory=end_memory,
        device=session.device,
        torch=_torch_version(),
    )


def _write_reports(
    prepared: PreparedRun,
    info: RunInfo,
    records: list[Any],
    session: RunSession,
    snapshot: SnapshotRun | None,
    stream: TextIO | None,
    unwritten: dict[str, str],
) -> None:
    """lines.csv, meta.json and report.txt (each atomically), then the summary on
    ``stream`` (stderr; in a launch only rank 0 prints it, every rank with
    ``--all-ranks``); in a launch, rebuild the launch folder's ranks table, and on rank 0
    wait up to ``--rank-wait`` seconds for the other ranks and print the table. A file
    that cannot be written (a full disk) joins ``unwritten`` (its name: why), said in one
    line at the end and left out of the summary's list of reports; nothing here raises
    ``OSError``, so the exit code stays the script's."""
    from ..runfolder.render import render_line_report, render_summary

    folder, options, rank = prepared.folder, prepared.options, prepared.rank
    merge = snapshot.result if snapshot is not None else None
    censuses = []
    if session.censuses:  # the tracker's renderer, imported only when there is one to render
        from ..tracker.render import render_stamp

        censuses = [render_stamp(stamp) for stamp in session.censuses]
    report = render_line_report(info, records, censuses, merge)
    writes = (
        (folder.lines, lambda: write_lines(folder.lines, records)),
        (folder.meta, lambda: write_meta(folder.meta, info)),
        (
            folder.report,
            lambda: replace_text(folder.report, report),
        ),
    )
    for path, write in writes:
        try:
            write()
        except OSError as exc:
            unwritten[path.name] = exc.strerror or str(exc)
    out = stream or sys.stderr
    try:  # the script may have closed our stderr: then there is nobody to tell
        if rank is None or rank.is_first or options.all_ranks:
            out.write(render_summary(info, records, folder.path, options.top, merge, unwritten))
        if rank is not None:
            report_launch(folder.path.parent, rank, options.rank_wait, out)
        if unwritten:
            kept = f"in {folder.path}; what was written is kept"
            why = "; ".join(f"{name}: {reason}" for name, reason in unwritten.items())
            out.write(f"gpu_mem_track: could not write {why} ({kept})\n")
        out.flush()
    except (OSError, ValueError):
        pass


def _sampler(prepared: PreparedRun) -> Any:
    """The CUDA allocator's sampler (following the rank's device when ``follow_rank``),
    else the C heap's (``--memory heap``), the live CPU tensor storages' (``--memory
    tensors``: imports torch now, before the script runs, and starts following storages)
    or the process RSS's."""
    if prepared.device.is_cuda:
        rank = prepared.rank
        local_rank = rank.local_rank if prepared.follow_rank and rank is not None else None
        return CudaSampler(prepared.device, local_rank=local_rank)
    memory = prepared.options.memory
    if memory == "tensors":
        from .tensorbytes import TensorSampler

        return TensorSampler()
    return HeapSampler() if memory == "heap" else RssSampler()


def _wants(prepared: PreparedRun) -> Any:
    """Whether a code object is the user's: the script, an ``--include``d file or a file
    under an ``--include``d folder, and never this package, torch or the standard library.
    Asked once per code object the program runs (8,000 in the runner's benchmark, from
    1,000 files), answered once per file name."""
    files, dirs = prepared.include_files, prepared.include_dirs
    libraries = library_dirs()
    real_path = _real_paths()
    decided: dict[str, bool] = {}

    def wants(code: CodeType) -> bool:
        name = code.co_filename
        answer = decided.get(name)
        if answer is None:
            real = real_path(name) if not name.startswith("<") else name
            answer = real in files or (real.startswith(dirs) and not libraries(real))
            decided[name] = answer
        return answer

    return wants


def _real_paths() -> Callable[[str], str]:
    """``os.path.realpath``, each folder resolved once: ``realpath(folder/name)`` is
    ``realpath(realpath(folder)/name)``, so a file of a folder seen before costs one
    ``lstat`` (2.5 us) where ``realpath`` takes one per component of the path (34 us for a
    file of torch in a virtual environment). A relative name (resolved from the working
    folder, which the script may change) or one ending in ``.`` or ``..`` goes to
    ``realpath`` whole."""
    folders: dict[str, str] = {}
    realpath, split, join, islink = os.path.realpath, os.path.split, os.path.join, os.path.islink

    def real_path(name: str) -> str:
        folder, last = split(name)
        if not os.path.isabs(name) or last in ("", ".", ".."):
            return realpath(name)
        real_folder = folders.get(folder)
        if real_folder is None:
            real_folder = folders[folder] = realpath(folder)
        path = join(real_folder, last)
        return realpath(path) if islink(path) else path

    return real_path


def _info(prepared: PreparedRun, source: str, engine: str, profiler: LineProfiler) -> RunInfo:
    path = prepared.folder.path
    return RunInfo(
        run_name=path.name if prepared.rank is None else f"{path.parent.name}/{path.name}",
        script=str(prepared.script),
        argv=(prepared.options.script, *prepared.options.args),
        device=str(prepared.device),
        memory_source=source,
        engine=engine,
        started=time.time(),
        python=platform.python_version(),
        torch=_torch_version(),
        gpu_mem_track=__version__,
        line_sink="native" if profiler.native else "python",
        line_sink_note=profiler.native_note,
        **_rank_fields(prepared),
    )


def _rank_fields(prepared: PreparedRun) -> dict[str, Any]:
    rank = prepared.rank
    if rank is None:
        return {}
    launch = prepared.folder.path.parent.name
    return {"rank": rank.rank, "local_rank": rank.local_rank, "world_size": rank.world_size, "launch": launch}


def _torch_version() -> str:
    """The version of the torch the script imported ("" if it imported none)."""
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "")) if torch is not None else ""
