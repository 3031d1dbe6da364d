"""The ``estimate`` and ``batch-size`` subcommands: argument parsing and one library call each."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from .records import OPTIMIZERS

__all__ = ["add_commands", "run_command"]

COMMANDS = ("estimate", "batch-size")


def add_commands(commands: Any) -> None:
    """Add ``estimate`` and ``batch-size`` to the subparsers ``commands``."""
    estimate = commands.add_parser(
        "estimate",
        help="estimate a training step's GPU memory without a GPU",
        description="Simulate one training step (forward, loss, backward, optimizer step) on meta "
        "tensors and print per-layer parameters and activations, the totals and the peak. "
        "Example: estimate gpu_mem_track.examples:convnet --input 64x3x32x32",
    )
    _common(estimate, "input shape, e.g. 64x3x32x32 or 32x128:int64 (repeat for several inputs)")
    finder = commands.add_parser(
        "batch-size",
        help="find the largest batch whose step fits a memory budget",
        description="Fit the step's peak against the batch size from a few small batches, jump to "
        "the predicted largest batch and confirm it. Peaks come from the estimator unless --measure. "
        "Example: batch-size gpu_mem_track.examples:convnet --input 1x3x32x32 --budget 8GiB",
    )
    _common(finder, "input shape with the batch first, e.g. 1x3x32x32 (the batch size is replaced)")
    finder.add_argument("--budget", help="memory budget, e.g. 8GiB (default: the CUDA device's free memory)")
    finder.add_argument("--measure", action="store_true", help="measure real steps on the CUDA device")


def _common(parser: argparse.ArgumentParser, input_help: str) -> None:
    parser.add_argument("factory", help="model factory: package.module:function or path/to/file.py:function")
    parser.add_argument("--input", action="append", required=True, metavar="SHAPE", help=input_help)
    parser.add_argument("--optimizer", default="adam", help=f"one of {', '.join(OPTIMIZERS)} (default: adam)")
    parser.add_argument("--dtype", help="cast the model and inputs: fp32, bf16, fp16, ...")
    parser.add_argument(
        "--amp",
        nargs="?",
        const="fp16",
        default=None,
        metavar="DTYPE",
        help="simulate autocast (fp16 or bf16)",
    )
    parser.add_argument(
        "--inference", action="store_true", help="a forward pass under no_grad instead of training"
    )
    parser.add_argument("--device", default="cuda", help="target device: cuda (default) or cpu")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run_command(args: argparse.Namespace, fail: Callable[[str, int], int]) -> int:
    """Run ``args.command``; usage mistakes and failing model code exit 2 through ``fail``."""
    from .specs import load_factory, parse_input

    try:
        factory = load_factory(args.factory)
        inputs = [parse_input(text) for text in args.input]
        return (
            _estimate(args, factory, inputs)
            if args.command == "estimate"
            else _batch_size(args, factory, inputs)
        )
    except UsageError as exc:
        return fail(str(exc), 2)
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return fail(f"the model's step failed: {type(exc).__name__}: {first}", 2)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        optimizer=args.optimizer,
        dtype=args.dtype,
        amp=args.amp if args.amp is not None else False,
        training=not args.inference,
        device=args.device,
    )


def _estimate(args: argparse.Namespace, factory: Any, inputs: list[Any]) -> int:
    from .render import render_estimate
    from .simulate import estimate

    result = estimate(factory, inputs, **_options(args))
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n" if args.json else render_estimate(result))
    return 0


def _batch_size(args: argparse.Namespace, factory: Any, inputs: list[Any]) -> int:
    from ..units import parse_bytes
    from .batchsize import find_max_batch_size
    from .render import render_batch_size

    try:
        budget = parse_bytes(args.budget) if args.budget is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = find_max_batch_size(factory, inputs, budget=budget, measure=args.measure, **_options(args))
    sys.stdout.write(
        json.dumps(result.to_dict(), indent=2) + "\n" if args.json else render_batch_size(result)
    )
    return 0 if result.batch > 0 else 1  # no batch fits: a script must be able to tell
