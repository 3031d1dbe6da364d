"""``probe``: what the CUDA context, cuBLAS and cuDNN cost (``tracker.probe``)."""

from __future__ import annotations

import argparse
import sys

from . import Command, print_result, report

__all__ = ["COMMAND"]


def prepare_parser(probe: argparse.ArgumentParser) -> None:
    probe.add_argument("--device", default="cuda:0", help="CUDA device to probe (default: cuda:0)")
    probe.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    """Probe the device; exit 1 when the probe cannot run here (no CUDA, no NVML)."""
    from ..devices import parse_device
    from ..errors import UsageError

    if not parse_device(args.device).is_cuda:
        raise UsageError(f"the probe measures CUDA devices, not {args.device!r}")
    from ..tracker.probe import ProbeError, run_probe, store_probe
    from ..tracker.render import render_probe

    try:
        result = run_probe(args.device)
    except ProbeError as exc:
        report(str(exc))
        return 1
    print_result(result, args.json, render_probe)
    saved = store_probe(result)  # MemTracker.track() reads it from here, never measuring itself
    print(
        f"saved for MemTracker: {saved}" if saved else "could not save it to the probe cache", file=sys.stderr
    )
    return 0


COMMAND = Command(
    name="probe",
    help="measure what the CUDA context, cuBLAS and cuDNN cost on a GPU",
    description="Measure, in a fresh subprocess, driver-level memory before CUDA starts, "
    "after the context exists, after the first cuBLAS matmul and after the first cuDNN "
    "convolution, and print the framework cost of each part; the result is saved to the probe cache, "
    "where MemTracker's stamps read the CUDA context cost. Needs CUDA and nvidia-ml-py.",
    prepare_parser=prepare_parser,
    run=run,
)
