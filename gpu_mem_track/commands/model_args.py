"""The arguments ``estimate`` and ``batch-size`` share: a model factory, its inputs and
the step's options (parsed by the library into one ``StepOptions``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..dtypes import DTYPE_ALIASES
from ..errors import UsageError
from ..estimator.options import AMP_DTYPES, STRATEGIES
from ..estimator.records import OPTIMIZERS
from . import count

#: ``--gpu`` names (kept here so building the parser imports no torch; checked against
#: ``gpumodel.workspace.GPU_ARCHITECTURES`` by the tests).
GPU_ARCHITECTURES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")

__all__ = [
    "add_model_arguments",
    "dist_options",
    "load_model",
    "load_step",
    "simulation_options",
    "step_options",
]

#: What may follow ``--amp``: the aliases of autocast's dtypes (fp16, half, bf16, ...).
AMP_ALIASES = tuple(alias for alias, name in DTYPE_ALIASES.items() if name in AMP_DTYPES)


class _AmpAction(argparse.Action):
    """``--amp [fp16|bf16]``: a value that is no AMP dtype is the factory ``--amp`` swallowed."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        if value is not None and value.lower() not in AMP_ALIASES:
            namespace.factory_after_amp, value = value, None
        namespace.amp = (value or "fp16").lower()


def add_model_arguments(parser: argparse.ArgumentParser, input_help: str) -> None:
    """Add the factory, ``--input`` and the step's options to ``parser``."""
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
        help="run forward and loss under torch.autocast('cuda'), in float16 unless bf16 is given "
        "(CUDA target; may come before the factory)",
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
    _add_simulation_arguments(parser)
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


def _add_simulation_arguments(parser: argparse.ArgumentParser) -> None:
    """``--step``, ``--warmup`` and the CUDA memory model's options."""
    parser.add_argument(
        "--step",
        metavar="MODULE:FUNCTION",
        help="your own step instead of the built-in one: package.module:function or file.py:function, "
        "called as function(model, optimizer, inputs); it computes its own loss and autocast, so "
        "--loss, --amp and --strategy do not apply (see docs/estimate.md)",
    )
    parser.add_argument(
        "--warmup",
        type=count,
        metavar="N",
        help="steps run before the measured one (default: 1 for training, so the optimizer state "
        "exists; 0 measures the very first step)",
    )
    parser.add_argument(
        "--alloc-conf",
        metavar="CONF",
        help="caching allocator settings as in PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True "
        "(default: that environment variable; CUDA target only)",
    )
    parser.add_argument(
        "--gpu",
        metavar="GPU",
        help=f"the simulated GPU the CUDA target runs on: an architecture ({', '.join(GPU_ARCHITECTURES)}; "
        "memory unbounded, default ampere) or a GPU such as a100-40gb or 24GiB:sm86 (its capacity: "
        "the step may run out of memory); sets the cuBLAS workspace default (32 MiB per handle from "
        "hopper on, else 8,519,680 B), the attention backend and the SM count that sizes CUDA's "
        "reduction staging (an architecture takes its data-centre GPU's: ampere the A100's 108)",
    )
    parser.add_argument(
        "--cublas-workspace",
        metavar="SIZE",
        help="bytes of one cuBLAS workspace (e.g. 32MiB, 0 for none) or a CUBLAS_WORKSPACE_CONFIG value "
        "such as :4096:8 (default: that environment variable, else the --gpu default)",
    )


def load_model(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The factory and the input specs named by ``args`` (``UsageError`` when unusable)."""
    from ..estimator.specs import load_callable, parse_input

    return load_callable(_factory_spec(args)), [parse_input(text) for text in args.input]


def step_options(args: argparse.Namespace) -> dict[str, Any]:
    """The step's options as typed, for the library to parse into one ``StepOptions``
    (the CUDA memory model's and ``--warmup`` included), and the ``--loss`` function when
    one is named (loaded here)."""
    options: dict[str, Any] = dict(
        optimizer=args.optimizer,
        dtype=args.dtype,
        amp=args.amp if args.amp is not None else False,
        training=not args.inference,
        device=args.device,
        warmup=args.warmup,
        alloc_conf=args.alloc_conf,
        gpu=args.gpu,
        cublas_workspace=_workspace(args.cublas_workspace),
    )
    if args.loss:
        from ..estimator.specs import load_callable

        options["loss_fn"] = load_callable(args.loss, "loss function")
    return options


def simulation_options(args: argparse.Namespace) -> dict[str, Any]:
    """What the library takes beside the step's options: the user's ``step`` (``--step``,
    None without one)."""
    return dict(step=load_step(args))


def load_step(args: argparse.Namespace) -> Any:
    """The user's step function named by ``--step`` (None without one)."""
    from ..estimator.specs import load_callable

    return load_callable(args.step, "step") if args.step else None


def _factory_spec(args: argparse.Namespace) -> str:
    """The factory as given: in its place, or swallowed by a ``--amp`` written before it."""
    swallowed = getattr(args, "factory_after_amp", None)
    if args.factory is None and swallowed is None:
        raise UsageError(
            f"{args.command} needs a model factory (package.module:function or file.py:function)"
        )
    if args.factory is not None and swallowed is not None:
        if ":" not in swallowed:  # --amp fp8: a dtype autocast does not take, not a factory
            dtypes = f"{', '.join(AMP_ALIASES[:-1])} or {AMP_ALIASES[-1]}"
            raise UsageError(f"--amp takes autocast's dtype: {dtypes} (default fp16), not {swallowed!r}")
        raise UsageError(f"two factories given: {swallowed} and {args.factory}")
    return args.factory or swallowed


def _workspace(text: str | None) -> int | str | None:
    """``--cublas-workspace``: a byte size, or a ``CUBLAS_WORKSPACE_CONFIG`` value (``:SIZE:COUNT``)."""
    if text is None or text.lstrip().startswith(":"):
        return text
    from ..units import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise UsageError(f"--cublas-workspace: {exc}") from None


def dist_options(args: argparse.Namespace) -> dict[str, Any]:
    """The distributed options as typed, for ``DistOptions.parse``."""
    try:
        cap = None if args.bucket_cap_mb is None else float(args.bucket_cap_mb)
    except ValueError:
        raise UsageError(f"--bucket-cap-mb must be a number, not {args.bucket_cap_mb!r}") from None
    return dict(
        world_size=args.world_size,
        strategy=args.strategy,
        bucket_cap_mb=cap,
        gradient_as_bucket_view=args.gradient_as_bucket_view,
        fsdp_units=tuple(args.fsdp_units or ()),
        reshard_after_forward=not args.no_reshard_after_forward,
    )
