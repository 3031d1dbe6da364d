"""``batch-size``: the largest batch whose step fits a budget (``estimator.batchsize``)."""

from __future__ import annotations

import argparse
from typing import Any

from . import Command, print_result, report
from .model_args import add_model_arguments, dist_options, load_model, simulation_options, step_options

__all__ = ["COMMAND"]


def prepare_parser(finder: argparse.ArgumentParser) -> None:
    add_model_arguments(
        finder, "input shape with the batch first, e.g. 1x3x32x32 (the batch size is replaced)"
    )
    finder.add_argument(
        "--budget",
        help="memory budget, e.g. 8GiB (default: the capacity of the GPU --gpu names, else the CUDA "
        "device's free memory)",
    )
    finder.add_argument("--measure", action="store_true", help="measure real steps on the CUDA device")
    finder.add_argument(
        "--budget-on",
        choices=("reserved", "allocated"),
        default="reserved",
        help="what the budget limits on the CUDA target: reserved (the allocator's segments, what "
        "runs out; default) or allocated (max_memory_allocated)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the answer and its probes; exit 1 when no batch fits."""
    from ..errors import UsageError
    from ..estimator.batchsize import find_max_batch_size
    from ..estimator.options import DistOptions
    from ..estimator.render import render_batch_size
    from ..units import parse_bytes

    if args.budget is not None and args.budget.strip().startswith("-"):  # as the finder says 0 B
        raise UsageError(f"the memory budget must be positive, not {args.budget.strip()}")
    try:
        budget = parse_bytes(args.budget) if args.budget is not None else None
    except ValueError as exc:
        raise UsageError(f"--budget: {exc}") from None
    distributed = DistOptions.parse(**dist_options(args))
    factory, inputs = load_model(args)
    simulation = simulation_options(args)
    simulation["model_step"] = simulation.pop("step")  # the finder's ``step`` is a measured step(batch)
    result = find_max_batch_size(
        factory,
        inputs,
        budget=budget,
        measure=args.measure,
        budget_on=args.budget_on,
        distributed=distributed,
        **step_options(args),
        **simulation,
    )
    print_result(result, args.json, render_batch_size)
    if not result.batch:  # exit 1: a script must be able to tell, and a reader of --json why
        report(_nothing_fits(result, args))
    return 0 if result.batch > 0 else 1


def _nothing_fits(result: Any, args: argparse.Namespace) -> str:
    """Why no batch fits, in one line: the smallest batch's peak against the budget, and for
    steps measured on CUDA the cuBLAS workspaces any step with a matmul holds whatever its
    batch (one for the forward's thread, one for autograd's: 2 x 32 MiB on Hopper), which
    a budget below them can never hold."""
    from ..units import format_bytes

    first = result.probes[0]
    peak = "ran out of memory" if first.peak is None else f"peaks at {first.peak:,} B"
    line = f"no batch fits the {format_bytes(result.budget)} budget: batch {first.batch}'s step {peak}"
    if not (args.measure and args.device.startswith("cuda")):
        return line
    line += f" ({args.budget_on})"
    import torch

    from ..gpumodel.workspace import GPU_ARCHITECTURES, workspace_bytes

    major, minor = torch.cuda.get_device_capability(args.device)
    arch = next((name for name, cc in GPU_ARCHITECTURES.items() if cc == f"{major}.{minor}"), None)
    handles = 1 if args.inference else 2
    held = handles * workspace_bytes(arch)
    return (
        f"{line}, counting the cuBLAS workspaces its matmuls create on {args.device} (compute capability "
        f"{major}.{minor}): {handles} x {format_bytes(held // handles)} whatever the batch"
        + (", which alone take the whole budget" if held >= result.budget else "")
        + " (CUBLAS_WORKSPACE_CONFIG sets their size)"
    )


COMMAND = Command(
    name="batch-size",
    help="find the largest batch whose step fits a memory budget",
    description="Fit the step's peak against the batch size from a few small batches, jump to "
    "the predicted largest batch and confirm it. Peaks come from the estimator unless --measure; "
    "on the CUDA target the budget limits reserved memory unless --budget-on allocated. "
    "Example: batch-size gpu_mem_track.examples:convnet --input 1x3x32x32 --budget 8GiB",
    prepare_parser=prepare_parser,
    run=run,
)
