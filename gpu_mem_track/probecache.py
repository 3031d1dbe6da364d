"""Where ``gpu-mem-track probe`` saves its results, and the newest saved result for a GPU,
read without torch and without the tracker: a floor below the simulated GPU's catalog
(``simgpu.catalog``, which gives a saved result precedence over its own non-PyTorch
figures) and the tracker's probe (``tracker.probe``, which writes and reads the files).

The folder is ``GPU_MEM_TRACK_CACHE``, else ``~/.cache/gpu_mem_track``; each result is a
``probe-*.json`` file holding ``ProbeResult.to_dict()`` (``tracker.records``): the GPU's
name, the torch version and the stages, each with the driver's bytes and the allocator's
reserved bytes. ``GPU_MEM_TRACK_SAVED_PROBE=off`` (or ``0``, ``no``, ``false``) makes the
simulated GPU ignore saved results (the catalog's figures, for tests and reproducible
reports).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .switches import switched_off

__all__ = [
    "SAVED_PROBE_ENV",
    "SAVED_SOURCE",
    "cache_folder",
    "saved_costs",
    "saved_results",
    "stage_costs",
    "use_saved",
]

#: The environment variable that turns saved probe results off for the simulated GPU.
SAVED_PROBE_ENV = "GPU_MEM_TRACK_SAVED_PROBE"
#: How a saved result's source begins (``saved_costs``; the report says a saved probe counted).
SAVED_SOURCE = "measured by gpu-mem-track probe on this machine's"
#: The probe's stage whose cost is the CUDA context (``tracker.records.STAGES[1]``).
CONTEXT_STAGE = "CUDA context"
#: At most this many saved results are read, each at most this many bytes.
_MOST_FILES, _MOST_BYTES = 256, 1 << 20


def cache_folder(cache_dir: Path | str | None = None) -> Path:
    """``cache_dir``, else ``GPU_MEM_TRACK_CACHE``, else ``~/.cache/gpu_mem_track``."""
    if cache_dir:
        return Path(cache_dir)
    return Path(os.environ.get("GPU_MEM_TRACK_CACHE", Path.home() / ".cache" / "gpu_mem_track"))


def use_saved() -> bool:
    """Whether the simulated GPU uses saved probe results (``GPU_MEM_TRACK_SAVED_PROBE``
    is not ``off``, ``0``, ``no`` or ``false``)."""
    return not switched_off(SAVED_PROBE_ENV)


def saved_results(cache_dir: Path | str | None = None) -> Iterator[tuple[dict[str, Any], Path]]:
    """The saved results as dicts with their files, newest first; unreadable, oversized
    and malformed files are skipped, at most 256 files are read."""
    folder = cache_folder(cache_dir)
    try:
        paths = sorted(folder.glob("probe-*.json"), key=_mtime, reverse=True)[:_MOST_FILES]
    except OSError:
        return
    for path in paths:
        try:
            if path.stat().st_size > _MOST_BYTES:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            yield data, path


def stage_costs(data: dict[str, Any]) -> dict[str, int] | None:
    """Bytes each stage of a saved result added outside the caching allocator (the
    driver's growth less the allocator's), keyed by stage name; None when the stages are
    malformed or fewer than two."""
    stages = data.get("stages")
    if not isinstance(stages, list) or len(stages) < 2:
        return None
    try:
        read = [(str(s["name"]), int(s["driver"]), int(s["reserved"])) for s in stages]
    except (KeyError, TypeError, ValueError):
        return None
    return {
        after[0]: (after[1] - before[1]) - (after[2] - before[2]) for before, after in zip(read, read[1:])
    }


def saved_costs(gpu_name: str, cache_dir: Path | str | None = None) -> tuple[int, int, str] | None:
    """The non-PyTorch memory the newest saved result for a GPU named ``gpu_name``
    (``torch.cuda.get_device_name``) measured: ``(context bytes, cuBLAS and cuDNN bytes,
    source)``, each cost at least 0; None when there is none."""
    for data, path in saved_results(cache_dir):
        if data.get("gpu_name") != gpu_name:
            continue
        costs = stage_costs(data)
        if costs is None:
            continue
        context = max(costs.get(CONTEXT_STAGE, 0), 0)
        libraries = sum(max(cost, 0) for name, cost in costs.items() if name != CONTEXT_STAGE)
        source = f"{SAVED_SOURCE} {gpu_name} (torch {data.get('torch_version', '?')}; {path})"
        return context, libraries, source
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
