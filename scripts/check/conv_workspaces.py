"""On a real GPU: the cuDNN workspaces each convolution of a small convnet allocates, next
to what ``gpumodel.cudnn`` predicts, for the evidence the ResNet-50 recording lacks
(float32 and TF32 engines, ``cudnn.benchmark`` off, channels-last).

Runs two training steps of ``gpu_mem_track.examples:convnet`` (batch 32, 3x32x32, as
``tests/test_estimate_cuda.py``) per configuration with the allocator's history recorded,
and prints every allocation that is freed before the next one (a workspace, or a kernel's
scratch) in the second step, in order, with the conv problems' X + Y for reference; then
the step's measured peak against ``estimate``'s. Needs CUDA; exits 2 without it.

    python scripts/check/conv_workspaces.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

CONFIGS = {
    "fp32": {"dtype": torch.float32, "channels_last": False},
    "fp32 channels-last": {"dtype": torch.float32, "channels_last": True},
    "fp16": {"dtype": torch.float16, "channels_last": False},
    "fp16 channels-last": {"dtype": torch.float16, "channels_last": True},
}


def transient(trace: list[dict]) -> list[int]:
    """Sizes allocated and freed before anything else is allocated or freed."""
    entries = [e for e in trace if e["action"] in ("alloc", "free_completed")]
    return [
        a["size"]
        for a, b in zip(entries, entries[1:])
        if a["action"] == "alloc" and b["action"] == "free_completed" and b["addr"] == a["addr"]
    ]


def step_workspaces(dtype: torch.dtype, channels_last: bool, benchmark: bool) -> list[int]:
    from gpu_mem_track import examples

    torch.backends.cudnn.benchmark = benchmark
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = examples.convnet().cuda().to(dtype=dtype, memory_format=fmt)
    x = torch.randn(32, 3, 32, 32, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    optimizer = torch.optim.Adam(model.parameters())
    model(x).float().sum().backward()  # the first step (plans chosen, trials made)
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    model(x).float().sum().backward()
    optimizer.step()
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    return transient(trace)


def main() -> int:
    if not torch.cuda.is_available():
        print("conv_workspaces.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    )
    print("convnet X + Y per conv (fp32 bytes): conv1 4,587,520; conv2 3,145,728 (fp16: half)")
    for name, config in CONFIGS.items():
        for benchmark in (False, True):
            sizes = step_workspaces(config["dtype"], config["channels_last"], benchmark)
            print(f"{name:20s} benchmark={benchmark!s:5s} transient allocations: {[f'{s:,}' for s in sizes]}")
    torch.backends.cudnn.benchmark = False
    from test_estimate_cuda import measured_peak

    from gpu_mem_track import estimate, examples

    measured = measured_peak("convnet", (32, 3, 32, 32), torch.device("cuda"))
    est = estimate(examples.convnet, (32, 3, 32, 32), device="cuda")
    estimated = est.peak - est.cublas_workspace
    error = estimated / measured - 1
    print(f"convnet step peak: measured {measured:,} B, estimated {estimated:,} B ({error:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
