"""The ``estimate`` and ``batch-size`` subcommands: argument parsing and one library call each."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from .records import OPTIMIZERS

AMP_DTYPES = ("fp16", "float16", "half", "bf16", "bfloat16")

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
    _common(
        estimate,
        "input shape, e.g. 64x3x32x32 or 32x128:int64 (repeat for several inputs; "
        "name=SHAPE passes one by keyword, e.g. labels=32x128:int64)",
    )
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


class _AmpAction(argparse.Action):
    """``--amp [fp16|bf16]``: a value that is no AMP dtype is the factory ``--amp`` swallowed."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        if value is not None and value.lower() not in AMP_DTYPES:
            namespace.factory_after_amp, value = value, None
        namespace.amp = (value or "fp16").lower()


def _common(parser: argparse.ArgumentParser, input_help: str) -> None:
    parser.add_argument(
        "factory",
        nargs="?",
        help="model factory: package.module:function or path/to/file.py:function",
    )
    parser.add_argument("--input", action="append", required=True, metavar="SHAPE", help=input_help)
    parser.add_argument("--optimizer", default="adam", help=f"one of {', '.join(OPTIMIZERS)} (default: adam)")
    parser.add_argument(
        "--dtype",
        help="cast the model and floating inputs: float32, float16, bfloat16, float64 (or fp32, fp16, "
        "half, bf16, fp64)",
    )
    parser.add_argument(
        "--amp",
        nargs="?",
        action=_AmpAction,
        metavar="fp16|bf16",
        help="simulate autocast, in float16 unless bf16 is given (may come before the factory)",
    )
    parser.add_argument(
        "--loss",
        metavar="FUNCTION",
        help="loss of the model's output: package.module:function or file.py:function "
        "(default: the output's own .loss when it has one, else the sum of its floating tensors)",
    )
    parser.add_argument(
        "--inference", action="store_true", help="a forward pass under no_grad instead of training"
    )
    parser.add_argument("--device", default="cuda", help="target device: cuda (default) or cpu")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run_command(args: argparse.Namespace, fail: Callable[[str, int], int]) -> int:
    """Run ``args.command``; usage mistakes and failing model code exit 2 through ``fail``."""
    from .specs import load_callable, parse_input

    try:
        factory = load_callable(_factory_spec(args))
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


def _factory_spec(args: argparse.Namespace) -> str:
    swallowed = getattr(args, "factory_after_amp", None)
    if args.factory is None and swallowed is None:
        raise UsageError(
            f"{args.command} needs a model factory (package.module:function or file.py:function)"
        )
    if args.factory is not None and swallowed is not None:
        raise UsageError(f"two factories given: {swallowed} and {args.factory}")
    return args.factory or swallowed


def _options(args: argparse.Namespace) -> dict[str, Any]:
    from .specs import load_callable
    from .step import default_loss

    return dict(
        optimizer=args.optimizer,
        dtype=args.dtype,
        amp=args.amp if args.amp is not None else False,
        training=not args.inference,
        device=args.device,
        loss_fn=load_callable(args.loss, "loss function") if args.loss else default_loss,
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
