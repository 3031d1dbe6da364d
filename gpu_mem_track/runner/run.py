"""``python -m gpu_mem_track run``: a whole script, line by line, with no code changes.

The sequence: check everything that can be checked before the script runs (``prepare``,
``UsageError`` on a user mistake; every output path made absolute), then ``execute``:
run the script as ``__main__`` under the tracing engine (``launch.run_script``), write
every report (also after an exception, ``sys.exit``, Ctrl-C, SIGTERM or SIGHUP), and
return the script's exit code.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import sysconfig
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import CodeType
from typing import Any, TextIO

from .. import __version__
from ..devices import parse_device
from ..errors import UsageError
from ..outputs import claim_name, safe_name
from .files import RunFolder, TimelineWriter, write_lines, write_meta
from .launch import run_script
from .profiler import LineProfiler
from .records import RunInfo, RunResult
from .samplers import CudaSampler, HeapSampler, RssSampler, mallinfo2
from .session import RunSession
from .tracer import best_engine, engine_class

__all__ = ["RunOptions", "PreparedRun", "prepare", "execute", "run"]

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # gpu_mem_track/
_NEVER = "torch, the standard library and gpu_mem_track are never traced"
_BUILT_IN = Path("<built-in>")  # a module compiled into Python (sys, os on 3.11): no source


@dataclass(frozen=True)
class RunOptions:
    """What to run and how; see ``python -m gpu_mem_track run --help``.

    ``census_threshold``: bytes; a line execution that grows memory by at least this much
    is followed by a census of live tensors (None: never). ``device``: ``"auto"``,
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. ``engine``: ``"auto"``, ``"monitoring"`` or
    ``"settrace"``. ``top``: lines in the printed summary (0: all). ``memory``: on the
    CPU, ``"rss"`` (the default, ``"auto"``) or ``"heap"`` (the C heap in use, see
    ``samplers.HeapSampler``); on CUDA only ``"auto"``. ``activations``: record the
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
    memory: str = "auto"


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
    script = _readable_script(options.script)
    files, dirs = _resolve_includes(options.include, script)
    device = _resolve_device(options.device)
    _check_memory(options.memory, device)
    try:
        engine_class(options.engine)
    except ValueError as exc:
        raise UsageError(f"--engine {options.engine}: {exc}") from exc
    if options.activations and importlib.util.find_spec("torch") is None:
        raise UsageError("--activations needs torch, which is not installed here")
    name = safe_name(options.run_name or f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    # Absolute now: a script that calls os.chdir() must not move our reports.
    out_dir = Path(options.out_dir).absolute()
    _check_out_dir(out_dir, options.out_dir)
    folder = RunFolder(_claim_folder(out_dir, name))
    return PreparedRun(options, script, folder, frozenset({str(script), *files}), dirs, device)


def run(options: RunOptions, stream: TextIO | None = None) -> int:
    """``prepare`` then ``execute``; returns the script's exit code."""
    return execute(prepare(options), stream).exit_code


def execute(prepared: PreparedRun, stream: TextIO | None = None) -> RunResult:
    """Run the prepared script under the line tracer, write the reports and return the
    :class:`~gpu_mem_track.runner.records.RunResult`: the script's exit code (0, the
    ``sys.exit`` code, 1 after an uncaught exception, 130 after Ctrl-C), the run's
    description, its line records and its automatic censuses. ``prepared`` is not changed."""
    from .render import render_line_report, render_summary

    options, folder = prepared.options, prepared.folder
    sampler = _sampler(prepared.device, options.memory)
    timeline = TimelineWriter(folder.timeline)
    session = RunSession(folder.path, prepared.device, timeline)
    profiler = LineProfiler(sampler, timeline, session.census, options.census_threshold)
    session.profiler = profiler
    engine = best_engine(profiler, _wants(prepared), options.engine)
    info = _info(prepared, sampler.source, engine.name)
    write_meta(folder.meta, info)
    profiler.event_row("start", where=(str(prepared.script), "<module>", None))
    code = 1
    try:
        if options.activations:
            session.census_tracker(activations=True)
        code = run_script(prepared, engine, session)
    finally:
        session.close()
        profiler.finish()
        profiler.event_row("end")
        timeline.close()
        sampler.close()
        records = profiler.records()
        where = f"{profiler.peak_at[0]}:{profiler.peak_at[1]}" if profiler.peak_at else ""
        info = replace(
            info, ended=time.time(), exit_code=code, peak=profiler.peak, peak_at=where, torch=_torch_version()
        )
        write_lines(folder.lines, records)
        write_meta(folder.meta, info)
        folder.report.write_text(render_line_report(info, records, session.censuses), encoding="utf-8")
        out = stream or sys.stderr
        out.write(render_summary(info, records, folder.path, options.top))
        out.flush()
    return RunResult(code, folder.path, info, tuple(records), tuple(session.censuses))


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
    is_library = _library_dirs()
    for name in names:
        path = Path(name)
        if path.exists():
            folder, target = path.is_dir(), str(path.resolve())
        else:
            origin = _module_origin(name, script)
            if origin is None:
                raise UsageError(f"--include {name}: no such file, folder or module")
            if origin == _BUILT_IN:
                raise UsageError(f"--include {name}: {_NEVER}")
            folder = origin.name == "__init__.py"
            target = str(origin.parent if folder else origin)
        if is_library(target + os.sep if folder else target):
            raise UsageError(f"--include {name}: {_NEVER}")
        (dirs.append(target + os.sep) if folder else files.add(target))
    return files, tuple(dirs)


def _module_origin(name: str, script: Path) -> Path | None:
    sys.path.insert(0, str(script.parent))
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        spec = None
    finally:
        sys.path.pop(0)
    if spec is not None and spec.origin in ("built-in", "frozen"):
        return _BUILT_IN
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


def _check_memory(memory: str, device: str) -> None:
    """``UsageError`` for a ``--memory`` choice that cannot be measured here."""
    if memory not in ("auto", "rss", "heap"):
        raise UsageError(f"--memory takes auto, rss or heap, not {memory!r}")
    if memory != "auto" and device != "cpu":
        raise UsageError(f"--memory {memory} measures the CPU; on {device} the CUDA allocator is read")
    if memory == "heap" and mallinfo2() is None:
        raise UsageError("--memory heap needs glibc 2.33 or later (mallinfo2), which this system lacks")


def _sampler(device: str, memory: str) -> Any:
    if device.startswith("cuda"):
        return CudaSampler(device)
    return HeapSampler() if memory == "heap" else RssSampler()


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


def _check_out_dir(out_dir: Path, given: str) -> None:
    """``UsageError`` when ``out_dir`` or a folder above it is an existing file."""
    for path in (out_dir, *out_dir.parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == out_dir else f" ({path} is a file)"
                what = "is a file, not a folder" if path == out_dir else "cannot be created"
                raise UsageError(f"cannot write reports to {given}: it {what}{where}")
            return


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
        argv=(prepared.options.script, *prepared.options.args),
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
