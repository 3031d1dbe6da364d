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
import sys
import sysconfig
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import CodeType, TracebackType
from typing import Any, TextIO

from .. import __version__
from ..devices import parse_device
from ..errors import UsageError
from ..outputs import claim_name, safe_name
from ..ranks import RankInfo, rank_folder, rank_info
from ..tracker.listeners import add_stamp_listener, remove_stamp_listener
from .files import RunFolder, TimelineWriter, write_lines, write_meta
from .launch import report_launch, terminate_as_exit
from .profiler import LineProfiler
from .records import RunInfo, RunResult
from .samplers import CudaSampler, RssSampler
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
    all_ranks: bool = False
    rank_wait: float = 10.0


@dataclass
class PreparedRun:
    """A checked run: resolved paths, the folder (created), what to trace. In a
    distributed launch ``rank`` says which rank this is and ``folder`` is
    ``<launch>/rank<k>``; ``follow_rank``: the device is decided when the script
    starts CUDA (``ranks.rank_device``), ``device`` is ``cuda:<local rank>`` until then."""

    options: RunOptions
    script: Path
    folder: RunFolder
    include_files: frozenset[str]
    include_dirs: tuple[str, ...]
    device: str
    rank: RankInfo | None = None
    follow_rank: bool = False


def prepare(options: RunOptions, environ: Mapping[str, str] | None = None) -> PreparedRun:
    """Check the script, ``--include`` and the output folder, and create the run folder.

    Raises ``UsageError`` (one line naming the problem) for a missing or unreadable
    script, an unknown ``--include``, a bad device, an engine this Python lacks,
    ``--activations`` without torch, an output folder that cannot be written, or a
    launcher environment (``RANK``, ``WORLD_SIZE``) that makes no sense. ``environ``: the
    environment to read the rank from (default ``os.environ``).
    """
    script = _readable_script(options.script)
    rank = rank_info(environ)
    files, dirs = _resolve_includes(options.include, script)
    device = _resolve_device(options.device)
    try:
        engine_class(options.engine)
    except ValueError as exc:
        raise UsageError(f"--engine {options.engine}: {exc}") from exc
    if options.activations and importlib.util.find_spec("torch") is None:
        raise UsageError("--activations needs torch, which is not installed here")
    traced = frozenset({str(script), *files})
    if rank is not None:
        folder = RunFolder(rank_folder(options.out_dir, options.run_name, script, rank, environ))
        follow = device.startswith("cuda") and options.device in ("auto", "cuda")
        device = f"cuda:{rank.local_rank}" if follow else device
        return PreparedRun(options, script, folder, traced, dirs, device, rank, follow)
    name = safe_name(options.run_name or f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    folder = RunFolder(_claim_folder(Path(options.out_dir), name))
    return PreparedRun(options, script, folder, traced, dirs, device)


def run(options: RunOptions, stream: TextIO | None = None) -> int:
    """``prepare`` then ``execute``; returns the script's exit code."""
    return execute(prepare(options), stream).exit_code


def execute(prepared: PreparedRun, stream: TextIO | None = None) -> RunResult:
    """Run the prepared script under the line tracer, write the reports and return the
    :class:`~gpu_mem_track.runner.records.RunResult`: the script's exit code (0, the
    ``sys.exit`` code, 1 after an uncaught exception, 130 after Ctrl-C, 143 after SIGTERM
    in a distributed launch), the run's description, its line records and its automatic
    censuses. ``prepared`` is not changed."""
    options, folder, rank = prepared.options, prepared.folder, prepared.rank
    sampler = _sampler(prepared)
    timeline = TimelineWriter(folder.timeline)
    session = RunSession(folder.path, sampler if prepared.follow_rank else prepared.device, timeline)
    profiler = LineProfiler(
        sampler, timeline, session.census, options.census_threshold, rank=None if rank is None else rank.rank
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
        with terminate_as_exit(rank is not None):
            code = _run_script(prepared, engine, session)
    finally:
        session.close()
        profiler.finish()
        end_memory = sampler.sample()[0]
        profiler.event_row("end")
        timeline.close()
        sampler.close()
        records = profiler.records()
        info = _ended(info, code, profiler, session, end_memory)
        write_lines(folder.lines, records)
        write_meta(folder.meta, info)
        _report(prepared, info, records, session.censuses, stream or sys.stderr)
    return RunResult(code, folder.path, info, tuple(records), tuple(session.censuses))


def _sampler(prepared: PreparedRun) -> Any:
    if not prepared.device.startswith("cuda"):
        return RssSampler()
    local_rank = prepared.rank.local_rank if prepared.follow_rank and prepared.rank else None
    return CudaSampler(prepared.device, local_rank=local_rank)


def _ended(info: RunInfo, code: int, profiler: LineProfiler, session: RunSession, end_memory: int) -> RunInfo:
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


def _report(prepared: PreparedRun, info: RunInfo, records: list, censuses: list, out: TextIO) -> None:
    """Write report.txt; print the summary (in a launch: rank 0, or every rank with
    ``--all-ranks``); in a launch, rebuild the launch folder's ranks table, and on rank 0
    wait up to ``--rank-wait`` seconds for the other ranks and print the table."""
    from .render import render_line_report, render_summary

    folder, options, rank = prepared.folder, prepared.options, prepared.rank
    folder.report.write_text(render_line_report(info, records, censuses), encoding="utf-8")
    if rank is None or rank.is_first or options.all_ranks:
        out.write(render_summary(info, records, folder.path, options.top))
        out.flush()
    if rank is not None:
        report_launch(folder.path.parent, rank, options.rank_wait, out)


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
        _Forks.watch(None, None)
        remove_stamp_listener(session)
        sys.argv[:] = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0


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


def _readable_script(script: str) -> Path:
    path = Path(script)
    if not path.exists():
        raise UsageError(f"no such script: {script}")
    if path.is_dir():
        raise UsageError(f"{script} is a folder, not a Python script")
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise UsageError(f"cannot read {script}: {exc.strerror or exc}") from exc
    return path.resolve()


def _resolve_includes(names: tuple[str, ...], script: Path) -> tuple[set[str], tuple[str, ...]]:
    """``--include`` values as files and folders: paths as given, else module names found
    on the script's ``sys.path`` (a package means its folder)."""
    files: set[str] = set()
    dirs: list[str] = []
    for name in names:
        path = Path(name)
        if path.exists():
            (dirs.append(str(path.resolve()) + os.sep) if path.is_dir() else files.add(str(path.resolve())))
            continue
        origin = _module_origin(name, script)
        if origin is None:
            raise UsageError(f"--include {name}: no such file, folder or module")
        if origin.name == "__init__.py":
            dirs.append(str(origin.parent) + os.sep)
        else:
            files.add(str(origin))
    return files, tuple(dirs)


def _module_origin(name: str, script: Path) -> Path | None:
    sys.path.insert(0, str(script.parent))
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        spec = None
    finally:
        sys.path.pop(0)
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return Path(spec.origin).resolve()


def _resolve_device(device: str) -> str:
    """``cpu`` or ``cuda:N``, decided without importing torch or starting CUDA: the script
    may still set ``CUDA_VISIBLE_DEVICES`` before it imports torch. ``auto`` means
    ``cuda:0`` when the NVIDIA driver shows a GPU, else ``cpu``."""
    if device == "auto":
        return "cuda:0" if _driver_gpu_count() else "cpu"
    try:
        parsed = parse_device(device)
    except UsageError:
        raise UsageError(f"--device takes auto, cpu, cuda or cuda:N, not {device!r}") from None
    if not parsed.is_cuda:
        return str(parsed)
    if _driver_gpu_count() == 0:
        raise UsageError(f"--device {device}: no NVIDIA GPU is visible here")
    return str(parsed.with_index(0))


def _driver_gpu_count() -> int:
    """GPUs the NVIDIA driver lists (NVML when installed, else ``/proc/driver/nvidia``)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        gpus = Path("/proc/driver/nvidia/gpus")
        return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def _claim_folder(out_dir: Path, name: str) -> Path:
    """Create ``out_dir/name`` (or ``name-2``, ...), a folder no earlier run used."""

    def claim(candidate: str) -> bool:
        path = out_dir / candidate
        try:
            path.mkdir()
        except FileExistsError:
            return False
        check = path / ".write-check"  # a folder we may create but not write into fails here
        check.write_text("")
        check.unlink()
        return True

    return out_dir / claim_name(out_dir, name, claim)


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
    path = prepared.folder.path
    return RunInfo(
        run_name=path.name if prepared.rank is None else f"{path.parent.name}/{path.name}",
        script=str(prepared.script),
        argv=(str(prepared.script), *prepared.options.args),
        device=prepared.device,
        memory_source=source,
        engine=engine,
        started=time.time(),
        python=platform.python_version(),
        torch=_torch_version(),
        gpu_mem_track=__version__,
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
