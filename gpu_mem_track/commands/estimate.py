"""``estimate``: a training step's memory without a GPU (``estimator.simulate``)."""

from __future__ import annotations

import argparse

from . import Command, print_result
from .model_args import add_model_arguments, dist_options, load_model, simulation_options, step_options

__all__ = ["COMMAND"]


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(
        parser,
        "input shape, e.g. 64x3x32x32 or 32x128:int64 (repeat for several inputs; "
        "name=SHAPE passes one by keyword, e.g. labels=32x128:int64)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the estimate as a table or JSON."""
    from ..estimator.options import DistOptions
    from ..estimator.render import render_estimate
    from ..estimator.simulate import estimate

    DistOptions.parse(**dist_options(args))  # a bad option fails before the model loads
    factory, inputs = load_model(args)
    result = estimate(factory, inputs, **step_options(args), **simulation_options(args), **dist_options(args))
    print_result(result, args.json, render_estimate)
    return 0


COMMAND = Command(
    name="estimate",
    help="estimate a training step's GPU memory without a GPU",
    description="Simulate one training step (forward, loss, backward, optimizer step, or your own "
    "--step) on the simulated GPU (--device cpu: exact sizes) and print per-layer parameters and "
    "activations, the totals, the peak allocated and, on the CUDA target, the reserved peak, the "
    "fragmentation at the peak and the cuBLAS workspaces (the caching allocator modelled). "
    "Example: estimate gpu_mem_track.examples:convnet --input 64x3x32x32. With --world-size "
    "and --strategy (ddp, zero1, zero2, fsdp) it estimates each rank of a distributed step "
    "(the built-in step only, not --step).",
    prepare_parser=prepare_parser,
    run=run,
)
