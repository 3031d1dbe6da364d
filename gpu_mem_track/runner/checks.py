"""The runner's checks before anything runs (``run.prepare``): the script, ``--include``,
the device, ``--memory``, ``--snapshot`` and the run folder. Each raises ``UsageError`` with one line
naming the problem. Nothing here imports torch or starts CUDA.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..devices import Device, parse_device
from ..errors import UsageError
from .samplers import mallinfo2

if TYPE_CHECKING:
    from .options import RunOptions

__all__ = [
    "check_budgets",
    "check_engine",
    "check_memory",
    "check_out_dir",
    "check_snapshot",
    "driver_gpu_count",
    "library_dirs",
    "readable_script",
    "resolve_device",
    "resolve_includes",
]

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # gpu_mem_track/
_NEVER = "torch, the standard library and gpu_mem_track are never traced"
_BUILT_IN = Path("<built-in>")  # a module compiled into Python (sys, os on 3.11): no source


def check_budgets(max_iterations: int | None, max_seconds: float | None) -> None:
    """``UsageError`` for ``--max-iterations`` below 1 or ``--max-seconds`` not above 0."""
    if max_iterations is not None and max_iterations < 1:
        raise UsageError(f"--max-iterations must be at least 1, not {max_iterations}")
    if max_seconds is not None and not max_seconds > 0:
        raise UsageError(f"--max-seconds must be above 0, not {max_seconds}")


def check_engine(engine: str) -> None:
    """``UsageError`` for an ``--engine`` this Python lacks."""
    from .tracer import engine_class

    try:
        engine_class(engine)
    except ValueError as exc:
        raise UsageError(f"--engine {engine}: {exc}") from exc


def check_snapshot(options: RunOptions, device: Device) -> None:
    if not device.is_cuda:
        where = (
            "no NVIDIA GPU is visible here" if options.device == "auto" else f"not --device {options.device}"
        )
        raise UsageError(f"--snapshot records the CUDA allocator's history and needs a CUDA device: {where}")
    if importlib.util.find_spec("torch") is None:
        raise UsageError("--snapshot needs torch, which is not installed here")
    if options.snapshot_entries < 1:
        raise UsageError(f"--snapshot-entries must be at least 1, not {options.snapshot_entries}")


def readable_script(script: str) -> Path:
    path = Path(script)
    if not path.exists():
        raise UsageError(f"no such script: {script}")
    if path.is_dir():  # python runs a folder's __main__.py
        if not (path / "__main__.py").is_file():
            raise UsageError(f"{script} is a folder without a __main__.py, not a Python script")
        return path.resolve()
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise UsageError(f"cannot read {script}: {exc.strerror or exc}") from exc
    return path.resolve()


def resolve_includes(names: tuple[str, ...], script: Path) -> tuple[set[str], tuple[str, ...]]:
    """``--include`` values as files and folders: paths as given, else module names found
    on the script's ``sys.path`` (a package means its folder)."""
    files: set[str] = set()
    dirs: list[str] = []
    is_library = library_dirs()
    for name in names:
        path = Path(name)
        if path.exists():
            folder, target = path.is_dir(), str(path.resolve())
        else:
            origin = module_origin(name, script)
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


def module_origin(name: str, script: Path) -> Path | None:
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


def resolve_device(device: str) -> Device:
    """The CPU or ``cuda:N`` (an index always filled in), decided without importing torch
    or starting CUDA: the script
    may still set ``CUDA_VISIBLE_DEVICES`` before it imports torch. ``auto`` means
    ``cuda:0`` when the NVIDIA driver shows a GPU, else ``cpu``."""
    if device == "auto":
        return Device("cuda", 0) if driver_gpu_count() else Device("cpu")
    try:
        parsed = parse_device(device)
    except UsageError:
        raise UsageError(f"--device takes auto, cpu, cuda or cuda:N, not {device!r}") from None
    if not parsed.is_cuda:
        return parsed
    if driver_gpu_count() == 0:
        raise UsageError(f"--device {device}: no NVIDIA GPU is visible here")
    return parsed.with_index(0)


def check_memory(memory: str, device: Device) -> None:
    """``UsageError`` for a ``--memory`` choice that cannot be measured here."""
    if memory not in ("auto", "rss", "heap", "tensors"):
        raise UsageError(f"--memory takes auto, rss, heap or tensors, not {memory!r}")
    if memory != "auto" and device.is_cuda:
        raise UsageError(f"--memory {memory} measures the CPU; on {device} the CUDA allocator is read")
    if memory == "heap" and mallinfo2() is None:
        raise UsageError("--memory heap needs glibc 2.33 or later (mallinfo2), which this system lacks")
    if memory == "tensors" and importlib.util.find_spec("torch") is None:
        raise UsageError("--memory tensors needs torch, which is not installed here")


def driver_gpu_count() -> int:
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


def check_out_dir(out_dir: Path, given: str) -> None:
    """``UsageError`` when ``out_dir`` or a folder above it is an existing file."""
    for path in (out_dir, *out_dir.parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == out_dir else f" ({path} is a file)"
                what = "is a file, not a folder" if path == out_dir else "cannot be created"
                raise UsageError(f"cannot write reports to {given}: it {what}{where}")
            return


def library_dirs() -> Any:
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
