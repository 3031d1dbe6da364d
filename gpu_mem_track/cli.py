"""Command line: ``python -m gpu_mem_track <command>``; each command is one library call.

The commands live in ``commands/``, one module each. Exit codes: 0 success, 1 the
command could not run here (no CUDA for the probe, no matplotlib for the plot) or a bug
in gpu_mem_track (with its traceback), 2 a usage mistake (bad option, missing or
unreadable file), 130 after Ctrl-C. ``run`` exits with the script's own code.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from collections.abc import Sequence

from ._version import __version__
from .commands import all_commands, report
from .commands.cmdline import split_script_argv
from .errors import UsageError

__all__ = ["BUG_REPORT", "build_parser", "main"]

#: The line printed under the traceback of an unexpected exception.
BUG_REPORT = "this is a bug in gpu_mem_track; please report it with the traceback above"


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m gpu_mem_track`` parser, one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="python -m gpu_mem_track",
        description="Where GPU memory goes: line by line, tensor by tensor, byte by byte.",
    )
    parser.add_argument("--version", action="version", version=f"gpu_mem_track {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in all_commands():
        sub = subparsers.add_parser(command.name, help=command.help, description=command.description)
        command.prepare_parser(sub)
        sub.set_defaults(run=command.run)
    return parser


def _negative_values(tokens: list[str]) -> list[str]:
    """``--budget -5GiB`` as ``--budget=-5GiB``: argparse takes a value that starts with
    ``-`` and is not a plain number for an option and says "expected one argument"; joined,
    the command's own check names what is wrong with the value."""
    joined: list[str] = []
    for token in tokens:
        if (
            joined
            and re.match(r"-\.?\d", token)
            and joined[-1].startswith("--")
            and "=" not in joined[-1]
            and joined[-1] != "--"
        ):
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    A :class:`~gpu_mem_track.errors.UsageError` is the user's mistake: its message on one
    line, exit 2. Any other exception is a bug in gpu_mem_track: its traceback, a line
    asking to report it, exit 1.
    """
    parser = build_parser()
    head, script_args = split_script_argv(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(_negative_values(head))
    if script_args is not None:  # everything after the script, verbatim (a literal -- too)
        args.args = script_args
    try:
        return args.run(args)
    except UsageError as exc:
        report(str(exc))
        return 2
    except BrokenPipeError:  # the reader (``| head``) left: nothing more to say
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        report(BUG_REPORT)
        return 1
