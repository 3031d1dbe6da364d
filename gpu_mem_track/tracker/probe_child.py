"""The probe's child process: ``python -m gpu_mem_track.tracker.probe_child cuda:N [GPU-UUID]``.

Prints one JSON line (a ``ProbeResult``) on success; on failure prints one line on
stderr and exits 2. NVML is read before torch starts CUDA, so the first stage is the
process before any context exists. The GPU is found by UUID when one is given (the
parent then also restricts ``CUDA_VISIBLE_DEVICES`` to it), else by index, with the
parent asking CUDA to number devices in PCI order, as NVML does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ..devices import parse_device


class _Refused(Exception):
    """The probe cannot run here; the message says why."""


def main(argv: list[str]) -> int:
    device = argv[0] if argv else "cuda:0"
    uuid = argv[1] if len(argv) > 1 else None
    try:
        print(json.dumps(_measure(device, uuid)))
    except _Refused as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


def _measure(device: str, uuid: str | None) -> dict[str, Any]:
    import torch

    # is_available() asks the driver for a device count; it creates no CUDA context.
    if not torch.cuda.is_available():
        raise _Refused("CUDA is not available on this machine; the probe measures CUDA's own cost")
    nvml = _load_nvml()
    index = parse_device(device).ordinal
    if index >= torch.cuda.device_count():
        raise _Refused(f"no such device: {device} ({torch.cuda.device_count()} visible)")
    handle = (
        nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))
    )
    from .probe import run_stages
    from .readers import nvml_usage
    from .records import STAGES, ProbeResult, ProbeStage

    target = f"cuda:{index}"
    sources: list[str] = []

    def read() -> tuple[int, int, str]:
        usage = nvml_usage(nvml, handle, os.getpid())
        if usage is None:
            raise _Refused("NVML gave no memory reading for this GPU")
        sources.append(usage.source)
        reserved = torch.cuda.memory_reserved(target) if torch.cuda.is_initialized() else 0
        return usage.nbytes, reserved, usage.source

    stages = run_stages(read, dict(zip(STAGES[1:], _steps(torch, target))))
    if sources[-1] == "nvml process":
        # Before CUDA started the process was not listed: its own usage was zero, and the
        # first reading fell back to the whole device. Compare like with like.
        stages[0] = ProbeStage(stages[0].name, 0, 0)
    result = ProbeResult(
        device=target,
        gpu_name=torch.cuda.get_device_name(index),
        driver_source=sources[-1],
        torch_version=torch.__version__,
        stages=tuple(stages),
        uuid=str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or ""),
    )
    return result.to_dict()


def _load_nvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception as exc:
        raise _Refused("the probe needs NVML: pip install nvidia-ml-py (and an NVIDIA driver)") from exc
    return pynvml


def _steps(torch: Any, target: str) -> tuple[Callable[[], None], ...]:
    """The actions entering each stage after the first: context, cuBLAS, cuDNN."""

    def context() -> None:
        torch.empty(1, device=target)
        torch.cuda.synchronize(target)

    def matmul() -> None:
        a = torch.randn(256, 256, device=target)
        (a @ a).sum().item()

    def convolution() -> None:
        x = torch.randn(1, 3, 32, 32, device=target)
        w = torch.randn(8, 3, 3, 3, device=target)
        torch.nn.functional.conv2d(x, w).sum().item()

    return context, matmul, convolution


def _nvml_index(cuda_index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if entries and cuda_index < len(entries) and entries[cuda_index].isdigit():
        return int(entries[cuda_index])
    return cuda_index


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
