"""The runner's checks before anything runs (``run.prepare``): the script, ``--include``,
the device, ``--snapshot`` and the run folder. Each raises ``UsageError`` with one line
naming the problem. Nothing here imports torch or starts CUDA.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..devices import parse_device
from ..errors import UsageError
from ..outputs import claim_name

if TYPE_CHECKING:
    from .run import RunOptions

__all__ = ["check_snapshot", "claim_folder", "readable_script", "resolve_device", "resolve_includes"]


def check_snapshot(options: RunOptions, device: str) -> None:
    if not device.startswith("cuda"):
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
    if path.is_dir():
        raise UsageError(f"{script} is a folder, not a Python script")
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
    for name in names:
        path = Path(name)
        if path.exists():
            (dirs.append(str(path.resolve()) + os.sep) if path.is_dir() else files.add(str(path.resolve())))
            continue
        origin = module_origin(name, script)
        if origin is None:
            raise UsageError(f"--include {name}: no such file, folder or module")
        if origin.name == "__init__.py":
            dirs.append(str(origin.parent) + os.sep)
        else:
            files.add(str(origin))
    return files, tuple(dirs)


def module_origin(name: str, script: Path) -> Path | None:
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


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda:N``, decided without importing torch or starting CUDA: the script
    may still set ``CUDA_VISIBLE_DEVICES`` before it imports torch. ``auto`` means
    ``cuda:0`` when the NVIDIA driver shows a GPU, else ``cpu``."""
    if device == "auto":
        return "cuda:0" if driver_gpu_count() else "cpu"
    try:
        parsed = parse_device(device)
    except UsageError:
        raise UsageError(f"--device takes auto, cpu, cuda or cuda:N, not {device!r}") from None
    if not parsed.is_cuda:
        return str(parsed)
    if driver_gpu_count() == 0:
        raise UsageError(f"--device {device}: no NVIDIA GPU is visible here")
    return str(parsed.with_index(0))


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


def claim_folder(out_dir: Path, name: str) -> Path:
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
