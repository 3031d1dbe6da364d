"""The arguments ``estimate`` and ``batch-size`` share: a model factory, its inputs and
the step's options (parsed by the library into one ``StepOptions``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..estimator.options import STRATEGIES
from ..estimator.records import OPTIMIZERS

__all__ = ["add_model_arguments", "dist_options", "load_model", "step_options"]


def add_model_arguments(parser: argparse.ArgumentParser, input_help: str) -> None:
    """Add the factory, ``--input`` and the step's options to ``parser``."""
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
    ranks = parser.add_argument_group("distributed (per rank; the batch is per rank)")
    ranks.add_argument("--world-size", default=1, metavar="N", help="number of ranks (default: 1)")
    ranks.add_argument(
        "--strategy",
        help=f"one of {', '.join(STRATEGIES)} (default: ddp over more than one rank)",
    )
    ranks.add_argument("--bucket-cap-mb", metavar="MIB", help="DDP bucket size (default: 25, first bucket 1)")
    ranks.add_argument(
        "--gradient-as-bucket-view", action="store_true", help="DDP: gradients are views into the buckets"
    )
    ranks.add_argument(
        "--fsdp-units",
        action="append",
        metavar="PATTERN",
        help="FSDP: module names (fnmatch) given their own fully_shard, repeatable "
        "(default: each direct child with parameters; the root always)",
    )
    ranks.add_argument(
        "--no-reshard-after-forward",
        action="store_true",
        help="FSDP: keep unsharded parameters from forward to backward",
    )


def load_model(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The factory and the input specs named by ``args`` (``UsageError`` when unusable)."""
    from ..estimator.specs import load_factory, parse_input

    return load_factory(args.factory), [parse_input(text) for text in args.input]


def step_options(args: argparse.Namespace) -> dict[str, Any]:
    """The step's options as typed, for the library to parse into a ``StepOptions``."""
    return dict(
        optimizer=args.optimizer,
        dtype=args.dtype,
        amp=args.amp if args.amp is not None else False,
        training=not args.inference,
        device=args.device,
    )


def dist_options(args: argparse.Namespace) -> dict[str, Any]:
    """The distributed options as typed, for ``DistOptions.parse``."""
    try:
        cap = None if args.bucket_cap_mb is None else float(args.bucket_cap_mb)
    except ValueError:
        from ..errors import UsageError

        raise UsageError(f"--bucket-cap-mb must be a number, not {args.bucket_cap_mb!r}") from None
    return dict(
        world_size=args.world_size,
        strategy=args.strategy,
        bucket_cap_mb=cap,
        gradient_as_bucket_view=args.gradient_as_bucket_view,
        fsdp_units=tuple(args.fsdp_units or ()),
        reshard_after_forward=not args.no_reshard_after_forward,
    )
