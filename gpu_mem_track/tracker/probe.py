"""Context-overhead probe: what CUDA itself costs, measured in a fresh process.

A child process reads driver-level memory (NVML) and the allocator's reserved bytes at
four stages: before CUDA starts, once the context exists, after the first cuBLAS
matrix multiply and after the first cuDNN convolution. The difference between two
stages, less what the allocator reserved in between, is what that stage cost outside
the allocator: the framework cost the tracker separates from tensor cost.

The measurement runs in a subprocess so the measured program is never touched, and
only when asked (``gpu-mem-track probe``, ``cached_probe``): ``MemTracker.track()`` only
reads results already measured (``load_probe``), never starting a process or a CUDA
context. Results are cached per GPU (in memory, and on disk under
``$GPU_MEM_TRACK_CACHE`` or ``~/.cache/gpu_mem_track``) keyed by the GPU's UUID and the
torch and driver versions. ``saved_probe`` finds the newest result saved for a GPU model
by its name (what ``run --simulate`` of that GPU counts as its non-PyTorch memory).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ..outputs import safe_name
from ..probecache import cache_folder, saved_results
from .readers import nvml_uuid
from .records import STAGES, ProbeResult, ProbeStage

__all__ = [
    "STAGES",
    "ProbeError",
    "ProbeResult",
    "ProbeStage",
    "cached_probe",
    "load_probe",
    "run_probe",
    "run_stages",
    "saved_probe",
    "store_probe",
]


class ProbeError(RuntimeError):
    """The probe cannot run here (no CUDA, no NVML, or the child failed); the message says why."""


Reading = Callable[[], tuple[int, int, str]]


def run_stages(read: Reading, steps: dict[str, Callable[[], None]]) -> list[ProbeStage]:
    """Read (driver, reserved, source) before the first step and after each step.

    ``steps`` maps stage names (after the first) to the action that enters them. Returns
    the readings in order; the driver source of the last reading is in ``read``'s hands.
    """
    driver, reserved, _ = read()
    stages = [ProbeStage(STAGES[0], driver, reserved)]
    for name, step in steps.items():
        step()
        driver, reserved, _ = read()
        stages.append(ProbeStage(name, driver, reserved))
    return stages


def run_probe(device: str = "cuda:0", uuid: str | None = None, timeout: float = 300.0) -> ProbeResult:
    """Measure the framework cost on ``device`` in a fresh subprocess (takes seconds).

    With ``uuid`` (the GPU's UUID, known once CUDA runs) the child sees exactly that GPU;
    without it CUDA numbers devices in PCI order, as NVML does. Raises ``ProbeError``
    when CUDA or NVML is unavailable or the child fails.
    """
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "gpu_mem_track.tracker.probe_child", device]
    if uuid:
        env["CUDA_VISIBLE_DEVICES"] = nvml_uuid(uuid)
        command[-1:] = ["cuda:0", nvml_uuid(uuid)]  # the only GPU the child sees
    else:
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeError(f"the probe subprocess failed: {exc}") from exc
    lines = (done.stderr or done.stdout).strip().splitlines()
    if done.returncode != 0:
        raise ProbeError(lines[-1] if lines else f"the probe subprocess exited with {done.returncode}")
    try:
        result = ProbeResult.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ProbeError(f"the probe subprocess printed no result ({exc})") from exc
    return dataclasses.replace(result, device=device)


_MEMORY_CACHE: dict[str, ProbeResult] = {}


def cached_probe(device: str, uuid: str | None = None, cache_dir: Path | None = None) -> ProbeResult:
    """``run_probe`` once per GPU: from memory, else from the disk cache, else measured
    (a subprocess and a second CUDA context for a few seconds) and stored.

    The cache key is the GPU's UUID (else the device name) with the torch and NVIDIA
    driver versions; a change of any of them measures again.
    """
    result = load_probe(device, uuid, cache_dir)
    if result is None:
        result = run_probe(device, uuid)
        store_probe(result, cache_dir, uuid)  # under the GPU's UUID: what track() looks up
        if uuid is None:  # and under the device name, for the next call that knows only it
            store_probe(result, cache_dir, device)
    return result


def load_probe(device: str, uuid: str | None = None, cache_dir: Path | None = None) -> ProbeResult | None:
    """The probe result already measured for this GPU (memory, then disk cache), or None.

    Starts no process and no CUDA context: this is what ``MemTracker.track()`` uses.
    """
    key = _cache_key(uuid or device)
    if key in _MEMORY_CACHE:
        return dataclasses.replace(_MEMORY_CACHE[key], device=device)
    try:
        text = _cache_path(key, cache_dir).read_text(encoding="utf-8")
        result = dataclasses.replace(ProbeResult.from_dict(json.loads(text)), device=device)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _MEMORY_CACHE[key] = result
    return result


def store_probe(result: ProbeResult, cache_dir: Path | None = None, uuid: str | None = None) -> Path | None:
    """Keep ``result`` for later ``load_probe`` calls, in this process and on disk (keyed
    by ``uuid``, else the result's GPU UUID, else its device). Returns the file, or None
    when the cache folder cannot be written (that only costs a re-measurement)."""
    key = _cache_key(uuid or result.uuid or result.device)
    _MEMORY_CACHE[key] = result
    path = _cache_path(key, cache_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result.to_dict()), encoding="utf-8")
    except OSError:
        return None
    return path


def saved_probe(gpu_name: str, cache_dir: Path | None = None) -> tuple[ProbeResult, Path] | None:
    """The newest probe result saved in the cache folder for a GPU named ``gpu_name``
    (``torch.cuda.get_device_name``, e.g. ``"NVIDIA H200"``), with its file; None when
    there is none. Unreadable, oversized or malformed files are skipped; at most 256
    files are read (``probecache.saved_results``). Starts no process and no CUDA context."""
    for data, path in saved_results(cache_dir):
        try:
            result = ProbeResult.from_dict(data)
        except (ValueError, KeyError, TypeError):
            continue
        if result.gpu_name == gpu_name and len(result.stages) > 1:
            return result, path
    return None


def _cache_key(gpu: str) -> str:
    return "-".join((gpu, f"torch{_torch_version()}", f"driver{_driver_version()}"))


def _cache_path(key: str, cache_dir: Path | None) -> Path:
    return cache_folder(cache_dir) / f"probe-{safe_name(key)}.json"


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "unknown"))


def _driver_version() -> str:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return "unknown"
