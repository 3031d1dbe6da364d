"""The arguments ``estimate`` and ``batch-size`` share: a model factory, its inputs and
the step's options (parsed by the library into one ``StepOptions``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..estimator.records import OPTIMIZERS
from . import count

#: ``--gpu`` names (kept here so building the parser imports no torch; checked against
#: ``estimator.memory.GPU_ARCHITECTURES`` by the tests).
GPU_ARCHITECTURES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")

__all__ = [
    "add_model_arguments",
    "load_model",
    "load_step",
    "memory_options",
    "simulation_options",
    "step_options",
]


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
    parser.add_argument(
        "--step",
        metavar="MODULE:FUNCTION",
        help="your own step instead of the built-in one: package.module:function or file.py:function, "
        "called as function(model, optimizer, inputs) (see the README)",
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
        metavar="ARCH",
        help=f"GPU architecture for the cuBLAS workspace default: {', '.join(GPU_ARCHITECTURES)} "
        "(hopper: 32 MiB per handle; others 8,519,680 B)",
    )
    parser.add_argument(
        "--cublas-workspace",
        metavar="SIZE",
        help="bytes of one cuBLAS workspace (e.g. 32MiB, 0 for none) or a CUBLAS_WORKSPACE_CONFIG value "
        "such as :4096:8 (default: that environment variable, else the --gpu default)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


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


def simulation_options(args: argparse.Namespace) -> dict[str, Any]:
    """The estimator's own options: the user's ``step``, ``warmup`` and the CUDA memory model."""
    return dict(step=load_step(args), warmup=args.warmup, **memory_options(args))


def memory_options(args: argparse.Namespace) -> dict[str, Any]:
    """The CUDA memory model's options (``alloc_conf``, ``gpu``, ``cublas_workspace``)."""
    return dict(alloc_conf=args.alloc_conf, gpu=args.gpu, cublas_workspace=_workspace(args.cublas_workspace))


def load_step(args: argparse.Namespace) -> Any:
    """The user's step function named by ``--step`` (None without one)."""
    from ..estimator.specs import load_factory

    return load_factory(args.step, what="step") if args.step else None


def _workspace(text: str | None) -> int | str | None:
    """``--cublas-workspace``: a byte size, or a ``CUBLAS_WORKSPACE_CONFIG`` value (``:SIZE:COUNT``)."""
    if text is None or text.lstrip().startswith(":"):
        return text
    from ..errors import UsageError
    from ..units import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise UsageError(f"--cublas-workspace: {exc}") from None
