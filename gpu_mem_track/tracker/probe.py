"""Context-overhead probe: what CUDA itself costs, measured in a fresh process.

A child process reads driver-level memory (NVML) and the allocator's reserved bytes at
four stages: before CUDA starts, once the context exists, after the first cuBLAS
matrix multiply and after the first cuDNN convolution. The difference between two
stages, less what the allocator reserved in between, is what that stage cost outside
the allocator: the framework cost the tracker separates from tensor cost.

The measurement runs in a subprocess so the measured program is never touched, and
the result is cached per device (in memory, and on disk under
``$GPU_MEM_TRACK_CACHE`` or ``~/.cache/gpu_mem_track``) keyed by the GPU's UUID and the
torch and driver versions.
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
from .readers import nvml_uuid
from .records import STAGES, ProbeResult, ProbeStage

__all__ = ["STAGES", "ProbeError", "ProbeResult", "ProbeStage", "cached_probe", "run_probe", "run_stages"]


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
    """``run_probe`` once per GPU: from memory, else from the disk cache, else measured.

    The cache key is the GPU's UUID (else the device name) with the torch and NVIDIA
    driver versions; a change of any of them measures again.
    """
    key = "-".join((uuid or device, f"torch{_torch_version()}", f"driver{_driver_version()}"))
    if key in _MEMORY_CACHE:
        return _MEMORY_CACHE[key]
    folder = cache_dir or Path(
        os.environ.get("GPU_MEM_TRACK_CACHE", Path.home() / ".cache" / "gpu_mem_track")
    )
    path = folder / f"probe-{safe_name(key)}.json"
    try:
        cached = ProbeResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
        result = dataclasses.replace(cached, device=device)
    except (OSError, ValueError, KeyError, TypeError):
        result = run_probe(device, uuid)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result.to_dict()), encoding="utf-8")
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
    _MEMORY_CACHE[key] = result
    return result


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
