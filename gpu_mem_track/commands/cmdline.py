"""The ``run`` command line split where Python itself would split it.

``python train.py -- --out-dir x`` gives the script ``['train.py', '--', '--out-dir',
'x']``. argparse would drop that ``--`` (and read options after the script as its own),
so the runner's options are parsed only up to the script name, and every token after it
goes to the script verbatim.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["split_run_argv"]


def split_run_argv(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[list[str], list[str] | None]:
    """``(tokens up to and including the script, the script's arguments)`` when ``argv``
    is a ``run`` command line of ``parser`` (the top-level parser); ``(argv, None)``
    otherwise, or when no script is named (argparse then says what is missing)."""
    tokens = list(argv)
    if not tokens or tokens[0] != "run":
        return tokens, None
    value_options, all_options = _run_options(parser)
    index = 1
    while index < len(tokens):
        token = tokens[index]
        if token == "--":  # the script name follows, whatever it looks like
            index += 1
            break
        if not token.startswith("-") or token == "-":
            break
        name = _expand(token.split("=", 1)[0], all_options)
        if name not in all_options and not _ambiguous(name, all_options):
            # argparse would take the next token for the script and blame the top level
            _run_parser(parser).error(f"unrecognized arguments: {token}")
        takes_value = "=" not in token and name in value_options
        index += 2 if takes_value else 1
    if index >= len(tokens):
        return tokens, None
    return tokens[: index + 1], tokens[index + 1 :]


def _run_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["run"]


def _ambiguous(name: str, options: set[str]) -> bool:
    """Whether ``name`` abbreviates several options (argparse says so itself)."""
    return name.startswith("--") and sum(option.startswith(name) for option in options) > 1


def _run_options(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(options of ``run`` that take a value, all options of ``run``)."""
    run = _run_parser(parser)
    values: set[str] = set()
    every: set[str] = set()
    for action in run._actions:
        every.update(action.option_strings)
        if action.nargs != 0:
            values.update(action.option_strings)
    return values, every


def _expand(name: str, options: set[str]) -> str:
    """``name`` or the one option it abbreviates (argparse accepts unique prefixes)."""
    if name in options or not name.startswith("--"):
        return name
    matches = [option for option in options if option.startswith(name)]
    return matches[0] if len(matches) == 1 else name
