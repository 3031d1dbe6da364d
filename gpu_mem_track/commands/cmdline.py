"""The ``run`` and ``fit`` command lines split where Python itself would split them.

``python train.py -- --out-dir x`` gives the script ``['train.py', '--', '--out-dir',
'x']``. argparse would drop that ``--`` (and read options after the script as its own,
or join ``--lr -1`` as one), so the command's options and positionals are parsed only up
to the script name, and every token after it goes to the script verbatim.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["SCRIPT_COMMANDS", "split_script_argv"]

#: The commands that run a script, with how many positionals end at it (``fit``: the GPU,
#: then the script).
SCRIPT_COMMANDS = {"run": 1, "fit": 2}


def split_script_argv(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[list[str], list[str] | None]:
    """``(tokens up to and including the script, the script's arguments)`` when ``argv``
    is a command line of :data:`SCRIPT_COMMANDS` of ``parser`` (the top-level parser);
    ``(argv, None)`` otherwise, or when no script is named (argparse then says what is
    missing)."""
    tokens = list(argv)
    if not tokens or tokens[0] not in SCRIPT_COMMANDS:
        return tokens, None
    command = _command_parser(parser, tokens[0])
    value_options, all_options = _options(command)
    wanted, seen, literal = SCRIPT_COMMANDS[tokens[0]], 0, False
    index = 1
    while index < len(tokens):
        token = tokens[index]
        if token == "--" and not literal:  # positionals follow, whatever they look like
            literal = True
            index += 1
            continue
        if literal or not token.startswith("-") or token == "-":
            seen += 1
            if seen == wanted:  # the script
                return tokens[: index + 1], tokens[index + 1 :]
            index += 1
            continue
        name = _expand(token.split("=", 1)[0], all_options)
        if name not in all_options and not _ambiguous(name, all_options):
            # argparse would take the next token for the script and blame the top level
            command.error(f"unrecognized arguments: {token}")
        takes_value = "=" not in token and name in value_options
        index += 2 if takes_value else 1
    return tokens, None


def _command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def _ambiguous(name: str, options: set[str]) -> bool:
    """Whether ``name`` abbreviates several options (argparse says so itself)."""
    return name.startswith("--") and sum(option.startswith(name) for option in options) > 1


def _options(command: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(the command's options that take a value, all its options)."""
    values: set[str] = set()
    every: set[str] = set()
    for action in command._actions:
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
