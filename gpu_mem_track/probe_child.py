"""The probe's child process: ``python -m gpu_mem_track.probe_child cuda:N``.

Prints one JSON line (a ``ProbeResult``) on success; on failure prints one line on
stderr and exits 2. NVML is read before torch starts CUDA, so the first stage is the
process before any context exists.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    device = argv[0] if argv else "cuda:0"
    import torch

    # is_available() asks the driver for a device count; it creates no CUDA context.
    if not torch.cuda.is_available():
        print("CUDA is not available on this machine; the probe measures CUDA's own cost", file=sys.stderr)
        return 2
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:
        print("the probe needs NVML: pip install nvidia-ml-py (and an NVIDIA driver)", file=sys.stderr)
        return 2
    from .probe import STAGES, ProbeResult, ProbeStage, run_stages
    from .readers import nvml_handle, nvml_usage

    index = torch.device(device).index or 0
    if index >= torch.cuda.device_count():
        print(f"no such device: {device} ({torch.cuda.device_count()} visible)", file=sys.stderr)
        return 2
    target = f"cuda:{index}"
    handle_box: list = []
    sources: list[str] = []

    def read() -> tuple[int, int, str]:
        if not handle_box:
            # Before CUDA starts, find the GPU by index; the UUID needs CUDA running.
            handle_box.append(pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index)))
        usage = nvml_usage(pynvml, handle_box[0], os.getpid())
        source = usage.source if usage else "unavailable"
        sources.append(source)
        reserved = torch.cuda.memory_reserved(target) if torch.cuda.is_initialized() else 0
        return (usage.nbytes if usage else 0), reserved, source

    def context() -> None:
        torch.empty(1, device=target)
        torch.cuda.synchronize(target)
        handle = nvml_handle(pynvml, index)
        if handle is not None:
            handle_box[0] = handle

    def matmul() -> None:
        a = torch.randn(256, 256, device=target)
        (a @ a).sum().item()

    def convolution() -> None:
        x = torch.randn(1, 3, 32, 32, device=target)
        w = torch.randn(8, 3, 3, 3, device=target)
        torch.nn.functional.conv2d(x, w).sum().item()

    steps = dict(zip(STAGES[1:], (context, matmul, convolution)))
    stages = run_stages(read, steps)
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
    )
    print(json.dumps(result.to_dict()))
    return 0


def _nvml_index(cuda_index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if entries and cuda_index < len(entries) and entries[cuda_index].isdigit():
        return int(entries[cuda_index])
    return cuda_index


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
