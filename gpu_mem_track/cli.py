"""Command line: ``python -m gpu_mem_track <command>``; each command is one library call.

Exit codes: 0 success, 1 the command could not run here (no CUDA for the probe),
2 a usage mistake (bad option, missing or unreadable file).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m gpu_mem_track`` parser, one subcommand per library call."""
    parser = argparse.ArgumentParser(
        prog="python -m gpu_mem_track",
        description="Where GPU memory goes: line by line, tensor by tensor, byte by byte.",
    )
    parser.add_argument("--version", action="version", version=f"gpu_mem_track {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    probe = commands.add_parser(
        "probe",
        help="measure what the CUDA context, cuBLAS and cuDNN cost on a GPU",
        description="Measure, in a fresh subprocess, driver-level memory before CUDA starts, "
        "after the context exists, after the first cuBLAS matmul and after the first cuDNN "
        "convolution, and print the framework cost of each part. Needs CUDA and nvidia-ml-py.",
    )
    probe.add_argument("--device", default="cuda:0", help="CUDA device to probe (default: cuda:0)")
    probe.add_argument("--json", action="store_true", help="print the result as JSON")

    show = commands.add_parser(
        "show",
        help="print a CSV report as the text report",
        description="Render a CSV report written by MemTracker as the text report.",
    )
    show.add_argument("report", type=Path, help="CSV report (reports/<run>.csv)")
    show.add_argument("--totals-only", action="store_true", help="leave out the changed tensor groups")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "probe":
            return _probe(args.device, args.json)
        return _show(args.report, not args.totals_only)
    except BrokenPipeError:
        return 0


def _probe(device: str, as_json: bool) -> int:
    import torch

    from .probe import ProbeError, run_probe
    from .render import render_probe

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        return _fail(f"not a device: {device!r} (examples: cuda, cuda:1)", 2)
    if parsed.type != "cuda":
        return _fail(f"the probe measures CUDA devices, not {device!r}", 2)
    try:
        result = run_probe(device)
    except ProbeError as exc:
        return _fail(str(exc), 1)
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n" if as_json else render_probe(result))
    return 0


def _show(report: Path, detail: bool) -> int:
    from .csvlog import read_stamps
    from .render import render_stamps

    try:
        stamps = read_stamps(report)
    except FileNotFoundError:
        return _fail(f"no such report: {report}", 2)
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(f"cannot read {report}: {exc}", 2)
    except (ValueError, KeyError) as exc:
        return _fail(f"{report} is not a gpu_mem_track CSV report ({exc})", 2)
    sys.stdout.write(render_stamps(stamps, detail))
    return 0


def _fail(message: str, code: int) -> int:
    print(f"gpu_mem_track: {message}", file=sys.stderr)
    return code
