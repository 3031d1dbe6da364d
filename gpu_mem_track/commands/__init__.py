"""The subcommands of ``python -m gpu_mem_track``, one module each.

Each module holds one :class:`Command`: its name and help, how to add its arguments
(``prepare_parser``) and how to run it (``run``, one library call, returning the exit
code). A user mistake raises :class:`~gpu_mem_track.errors.UsageError`; ``cli.main``
prints its message and exits 2. Importing a command imports no torch: each ``run``
imports what it needs. ``cmdline`` splits a ``run`` command line at the script, where
argparse alone cannot.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Command",
    "add_max_bytes",
    "all_commands",
    "byte_size",
    "count",
    "notes",
    "print_result",
    "report",
]


@dataclass(frozen=True)
class Command:
    """One subcommand. ``prepare_parser(parser)`` adds its arguments to the subparser
    made from ``name``, ``help`` and ``description``; ``run(args)`` runs it on the
    parsed namespace and returns the exit code (0 success, 1 it could not run here)."""

    name: str
    help: str
    description: str
    prepare_parser: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def all_commands() -> tuple[Command, ...]:
    """Every subcommand, in the order ``--help`` lists them."""
    from . import batch_size, compare, estimate, fit, gpus, html, plot, probe, ranks, run, show, snapshot

    return (
        run.COMMAND,
        probe.COMMAND,
        show.COMMAND,
        ranks.COMMAND,
        compare.COMMAND,
        plot.COMMAND,
        estimate.COMMAND,
        batch_size.COMMAND,
        fit.COMMAND,
        snapshot.COMMAND,
        html.COMMAND,
        gpus.COMMAND,
    )


def count(text: str, least: int = 0) -> int:
    """An argparse type: an integer >= ``least`` (0; ``positive`` for 1)."""
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"not a count >= {least}: {text!r}")
    return value


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return count(text, 1)


def byte_size(text: str) -> int:
    """An argparse type: a byte size of at least 1 as ``units.parse_bytes`` reads it
    (``8GiB``, ``1.5GB``, ``4096``)."""
    from ..units import parse_bytes

    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a byte size of at least 1: {text!r}")
    return value


def add_max_bytes(parser: argparse.ArgumentParser) -> None:
    """``--max-bytes SIZE``: the most bytes of a memory snapshot read (``args.max_bytes``,
    None: the reader's default, ``snapshotfile.load.MAX_BYTES``)."""
    parser.add_argument(
        "--max-bytes",
        type=byte_size,
        metavar="SIZE",
        help="the most bytes of a memory snapshot read, on disk and once gunzipped (e.g. 8GiB; "
        "default 4GiB); a larger one is refused",
    )


def report(message: str) -> None:
    """Print ``message`` as the one line a command fails with, on stderr."""
    print(f"gpu_mem_track: {message}", file=sys.stderr)


def notes(lines: Sequence[str]) -> None:
    """What a reader had to do about missing or cut files: one line each, on stderr."""
    for line in lines:
        report(f"note: {line}")


def print_result(result: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    """Print a record on stdout: its ``to_dict()`` as JSON, or the text ``render`` makes."""
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n" if as_json else render(result))
