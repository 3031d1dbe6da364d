"""``python -m gpu_mem_track run``: a whole script, line by line, with no code changes.

The sequence: check everything that can be checked before the script runs (``prepare``,
``UsageError`` on a user mistake), then ``execute``: set ``sys.argv`` and ``sys.path[0]``,
start the tracing engine, ``runpy.run_path(..., run_name="__main__")``, stop the engine
and restore in ``finally``, write every report (also after an exception, ``sys.exit`` or
Ctrl-C), and return the script's exit code.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import runpy
import signal
import sys
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from types import CodeType, TracebackType
from typing import Any, TextIO

from .. import __version__
from ..errors import UsageError
from ..outputs import safe_name
from ..tracker.listeners import add_stamp_listener, remove_stamp_listener
from .checks import check_snapshot, claim_folder, readable_script, resolve_device, resolve_includes
from .files import RunFolder, TimelineWriter, write_lines, write_meta
from .history import DEFAULT_ENTRIES, HistoryRecorder
from .profiler import LineProfiler
from .recording import SnapshotRun
from .records import RunInfo, RunResult
from .samplers import CudaSampler, RssSampler, Sampler
from .session import RunSession
from .tracer import best_engine, engine_class

__all__ = ["RunOptions", "PreparedRun", "prepare", "execute", "run"]

_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_OUR_FILES = (os.path.abspath(__file__),)


@dataclass(frozen=True)
class RunOptions:
    """What to run and how; see ``python -m gpu_mem_track run --help``.

    ``census_threshold``: bytes; a line execution that grows memory by at least this much
    is followed by a census of live tensors (None: never). ``device``: ``"auto"``,
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. ``engine``: ``"auto"``, ``"monitoring"`` or
    ``"settrace"``. ``top``: lines in the printed summary. ``activations``: record the
    tensors autograd saves for backward while the script runs, so censuses count them as
    activations with the line that saved them (see ``saved.SavedTensorRecorder``).
    ``snapshot``: record the CUDA allocator's history while the script runs, keep it as
    ``snapshot.pickle`` in the run folder and take every line's exact peak from it (see
    ``recording``); ``snapshot_entries``: trace entries it keeps (a ring buffer).
    """

    script: str
    args: tuple[str, ...] = ()
    out_dir: str = "reports"
    run_name: str | None = None
    include: tuple[str, ...] = ()
    device: str = "auto"
    census_threshold: int | None = None
    engine: str = "auto"
    top: int = 5
    activations: bool = False
    snapshot: bool = False
    snapshot_entries: int = DEFAULT_ENTRIES


@dataclass
class PreparedRun:
    """A checked run: resolved paths, the folder (created), what to trace."""

    options: RunOptions
    script: Path
    folder: RunFolder
    include_files: frozenset[str]
    include_dirs: tuple[str, ...]
    device: str


def prepare(options: RunOptions) -> PreparedRun:
    """Check the script, ``--include`` and the output folder, and create the run folder.

    Raises ``UsageError`` (one line naming the problem) for a missing or unreadable
    script, an unknown ``--include``, a bad device, an engine this Python lacks,
    ``--activations`` without torch, or an output folder that cannot be written.
    """
    script = readable_script(options.script)
    files, dirs = resolve_includes(options.include, script)
    device = resolve_device(options.device)
    try:
        engine_class(options.engine)
    except ValueError as exc:
        raise UsageError(f"--engine {options.engine}: {exc}") from exc
    if options.activations and importlib.util.find_spec("torch") is None:
        raise UsageError("--activations needs torch, which is not installed here")
    if options.snapshot:
        check_snapshot(options, device)
    name = safe_name(options.run_name or f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    folder = RunFolder(claim_folder(Path(options.out_dir), name))
    return PreparedRun(options, script, folder, frozenset({str(script), *files}), dirs, device)


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
    :class:`~gpu_mem_track.runner.records.RunResult`: the script's exit code (0, the
    ``sys.exit`` code, 1 after an uncaught exception, 130 after Ctrl-C, 143 after
    SIGTERM), the run's description, its line records, its automatic censuses and, with
    ``--snapshot``, how the snapshot was merged. ``prepared`` is not changed.
    ``sampler`` and ``history`` replace the memory readings and torch's history recorder
    (tests pass fakes)."""
    options, folder = prepared.options, prepared.folder
    if sampler is None:
        sampler = CudaSampler(prepared.device) if prepared.device.startswith("cuda") else RssSampler()
    snapshot = _snapshot_run(prepared, sampler, history) if options.snapshot else None
    timeline = TimelineWriter(folder.timeline)
    session = RunSession(folder.path, prepared.device, timeline)
    profiler = LineProfiler(
        sampler,
        timeline,
        session.census,
        options.census_threshold,
        windows=snapshot.windows if snapshot else None,
    )
    session.profiler = profiler
    engine = best_engine(profiler, _wants(prepared), options.engine)
    info = _info(prepared, sampler.source, engine.name)
    write_meta(folder.meta, info)
    profiler.event_row("start", where=(str(prepared.script), "<module>", None))
    code = 1
    try:
        if options.activations:
            session.census_tracker(activations=True)
        if snapshot is not None:
            snapshot.start()
        code = _run_script(prepared, engine, session)
    finally:
        session.close()
        profiler.finish()
        profiler.event_row("end")
        timeline.close()
        records = profiler.records()
        if snapshot is not None:
            records = snapshot.finish(records)
        sampler.close()
        info = _finished(info, code, profiler)
        _write_reports(prepared, info, records, session, snapshot, stream)
    merge = snapshot.result if snapshot is not None else None
    return RunResult(code, folder.path, info, tuple(records), tuple(session.censuses), merge)


def _snapshot_run(prepared: PreparedRun, sampler: Any, history: HistoryRecorder | None) -> SnapshotRun:
    if history is None:
        from .history import TorchHistory

        history = TorchHistory()
    include = (str(prepared.script), *sorted(prepared.include_files), *prepared.include_dirs)
    return SnapshotRun(
        history, sampler, prepared.folder.path, prepared.device, prepared.options.snapshot_entries, include
    )


def _finished(info: RunInfo, code: int, profiler: LineProfiler) -> RunInfo:
    where = f"{profiler.peak_at[0]}:{profiler.peak_at[1]}" if profiler.peak_at else ""
    return replace(
        info, ended=time.time(), exit_code=code, peak=profiler.peak, peak_at=where, torch=_torch_version()
    )


def _write_reports(
    prepared: PreparedRun,
    info: RunInfo,
    records: list[Any],
    session: RunSession,
    snapshot: SnapshotRun | None,
    stream: TextIO | None,
) -> None:
    """lines.csv, meta.json and report.txt, then the summary on ``stream`` (stderr)."""
    from .render import render_line_report, render_summary

    folder, merge = prepared.folder, snapshot.result if snapshot is not None else None
    write_lines(folder.lines, records)
    write_meta(folder.meta, info)
    folder.report.write_text(render_line_report(info, records, session.censuses, merge), encoding="utf-8")
    out = stream or sys.stderr
    out.write(render_summary(info, records, folder.path, prepared.options.top, merge))
    out.flush()


def _run_script(prepared: PreparedRun, engine: Any, session: RunSession) -> int:
    script = str(prepared.script)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv[:] = [script, *prepared.options.args]
    if sys.path:
        sys.path[0] = str(prepared.script.parent)
    else:
        sys.path.append(str(prepared.script.parent))
    add_stamp_listener(session)
    _Forks.watch(engine, session)
    sigterm = _catch_sigterm()
    try:
        try:
            engine.start()
        except RuntimeError as exc:  # no free sys.monitoring tool slot: not the script's error
            print(f"gpu_mem_track: cannot trace: {exc}", file=sys.stderr)
            return 2
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            engine.stop()
        return 0
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        return 130
    except BaseException as exc:  # the script's own error: its traceback, then exit 1
        traceback.print_exception(type(exc), exc, _user_traceback(exc.__traceback__), file=sys.stderr)
        return 1
    finally:
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        _Forks.watch(None, None)
        remove_stamp_listener(session)
        sys.argv[:] = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0


def _catch_sigterm() -> Any:
    """While the script runs, SIGTERM ends it as ``sys.exit(143)`` would, so the reports
    (and a snapshot) are still written. Only where SIGTERM has its default action and in
    the main thread; returns the handler to restore (None: nothing installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    signal.signal(signal.SIGTERM, _terminated)
    return signal.SIG_DFL


def _terminated(signum: int, frame: Any) -> None:
    print("Terminated (SIGTERM)", file=sys.stderr)
    raise SystemExit(128 + signum)


class _Forks:
    """A forked child (a DataLoader worker) stops tracing and never writes our timeline."""

    engine: Any = None
    session: RunSession | None = None
    registered = False

    @classmethod
    def watch(cls, engine: Any, session: RunSession | None) -> None:
        cls.engine, cls.session = engine, session
        if not cls.registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=cls._in_child)
            cls.registered = True

    @classmethod
    def _in_child(cls) -> None:
        if cls.session is not None:
            cls.session.timeline.discard()
            remove_stamp_listener(cls.session)
        if cls.engine is not None:
            cls.engine.stop()
        cls.engine = cls.session = None


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as Python itself does
    return 1


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on: ours and runpy's left out."""
    runpy_file = os.path.abspath(runpy.__file__)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen runpy") or os.path.abspath(name) in (runpy_file, *_OUR_FILES)):
            break
        tb = tb.tb_next
    return tb


def _wants(prepared: PreparedRun) -> Any:
    """Whether a code object is the user's: the script, an ``--include``d file or a file
    under an ``--include``d folder, and never this package, torch or the standard library."""
    files, dirs = prepared.include_files, prepared.include_dirs
    libraries = _library_dirs()
    decided: dict[str, bool] = {}

    def wants(code: CodeType) -> bool:
        name = code.co_filename
        answer = decided.get(name)
        if answer is None:
            real = os.path.realpath(name) if not name.startswith("<") else name
            answer = real in files or (real.startswith(dirs) and not libraries(real))
            decided[name] = answer
        return answer

    return wants


def _library_dirs() -> Any:
    """A test for files of this package, torch and the standard library (but not of
    other installed packages, which ``--include`` may name)."""
    paths = sysconfig.get_paths()
    site = tuple({paths["purelib"] + os.sep, paths["platlib"] + os.sep})
    stdlib = tuple({paths["stdlib"] + os.sep, paths["platstdlib"] + os.sep})
    torch_spec = importlib.util.find_spec("torch")
    ours = [_PACKAGE_DIR + os.sep]
    if torch_spec is not None and torch_spec.origin:
        ours.append(str(Path(torch_spec.origin).resolve().parent) + os.sep)
    never = tuple(ours)

    def is_library(real: str) -> bool:
        return real.startswith(never) or (real.startswith(stdlib) and not real.startswith(site))

    return is_library


def _info(prepared: PreparedRun, source: str, engine: str) -> RunInfo:
    return RunInfo(
        run_name=prepared.folder.path.name,
        script=str(prepared.script),
        argv=(str(prepared.script), *prepared.options.args),
        device=prepared.device,
        memory_source=source,
        engine=engine,
        started=time.time(),
        python=platform.python_version(),
        torch=_torch_version(),
        gpu_mem_track=__version__,
    )


def _torch_version() -> str:
    """The version of the torch the script imported ("" if it imported none)."""
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "")) if torch is not None else ""
