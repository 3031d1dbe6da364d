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

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["ProbeError", "ProbeResult", "ProbeStage", "cached_probe", "run_probe", "run_stages"]

STAGES = ("before CUDA", "CUDA context", "first cuBLAS matmul", "first cuDNN convolution")


class ProbeError(RuntimeError):
    """The probe cannot run here (no CUDA, no NVML, or the child failed); the message says why."""


@dataclass(frozen=True)
class ProbeStage:
    """Readings after one stage: driver-level bytes and the allocator's reserved bytes."""

    name: str
    driver: int
    reserved: int


@dataclass(frozen=True)
class ProbeResult:
    """Stages measured on one device, and the framework cost of each step between them."""

    device: str
    gpu_name: str
    driver_source: str
    torch_version: str
    stages: tuple[ProbeStage, ...]

    def costs(self) -> dict[str, int]:
        """Bytes each stage added outside the caching allocator, keyed by stage name."""
        costs = {}
        for before, after in zip(self.stages, self.stages[1:]):
            costs[after.name] = (after.driver - before.driver) - (after.reserved - before.reserved)
        return costs

    @property
    def context(self) -> int:
        """The CUDA context's cost in bytes (the second stage's cost)."""
        return self.costs().get(STAGES[1], 0)

    @property
    def total(self) -> int:
        """Framework cost once CUDA, cuBLAS and cuDNN are all started, in bytes."""
        return sum(self.costs().values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        stages = tuple(ProbeStage(**s) for s in data["stages"])
        return cls(**{**data, "stages": stages})


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


def run_probe(device: str = "cuda:0", timeout: float = 300.0) -> ProbeResult:
    """Measure the framework cost on ``device`` in a fresh subprocess (takes seconds).

    Raises ``ProbeError`` when CUDA or NVML is unavailable or the child fails.
    """
    command = [sys.executable, "-m", "gpu_mem_track.probe_child", device]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"the probe subprocess did not finish within {timeout:.0f} s") from exc
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise ProbeError(lines[-1] if lines else f"the probe subprocess exited with {done.returncode}")
    return ProbeResult.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))


_MEMORY_CACHE: dict[str, ProbeResult] = {}


def cached_probe(device: str, cache_key: str, cache_dir: Path | None = None) -> ProbeResult:
    """``run_probe`` once per device: from memory, else from the disk cache, else measured.

    ``cache_key`` identifies the hardware and software (GPU UUID, torch and driver
    versions); a change of any of them measures again.
    """
    if cache_key in _MEMORY_CACHE:
        return _MEMORY_CACHE[cache_key]
    folder = cache_dir or Path(
        os.environ.get("GPU_MEM_TRACK_CACHE", Path.home() / ".cache" / "gpu_mem_track")
    )
    path = folder / f"probe-{_safe(cache_key)}.json"
    try:
        result = ProbeResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        result = run_probe(device)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result.to_dict()), encoding="utf-8")
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
    _MEMORY_CACHE[cache_key] = result
    return result


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)
