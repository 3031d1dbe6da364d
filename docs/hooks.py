"""The docs' build hook: command option tables made from the CLI's own parser.

A page writes ``<!-- options: fit -->`` where a command's options belong; at build time
(``mkdocs build``, which loads this file from ``hooks:`` in mkdocs.yml) the marker becomes
a Markdown table of every argument of that subcommand of
:func:`gpu_mem_track.cli.build_parser`: its flags and value, its default and its help text.
The tables cannot drift from the code, and ``tests/test_docs.py`` builds them the same way
to check that every command's every option is on some page.

Importing this module imports neither mkdocs nor torch (the CLI imports no torch).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: ``<!-- options: NAME -->``, alone on its line.
MARKER = re.compile(r"^<!-- options: ([a-z-]+) -->$", re.MULTILINE)


def _parser() -> argparse.ArgumentParser:
    """The CLI's parser, from this checkout (not an installed copy elsewhere)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gpu_mem_track.cli import build_parser

    return build_parser()


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's name and its subparser, in the order ``--help`` lists them."""
    parser = _parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("the CLI parser has no subcommands")


def arguments(sub: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user can give the command (``-h`` left out)."""
    return [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]


def _cell(text: str) -> str:
    """One table cell: on one line, with what Markdown would take for markup escaped
    (``|`` ends a cell, ``<script>`` in ``fit-<script>-<date>/`` would be an HTML tag)."""
    text = " ".join(text.split())
    for char, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(char, escaped)
    return text


def _usage(action: argparse.Action) -> str:
    """How the argument is written: ``--top N``, ``-o, --output OUTPUT``, ``script``."""
    if not action.option_strings:
        name = action.metavar or action.dest
        return f"`{name} ...`" if action.nargs in ("+", "*", argparse.REMAINDER) else f"`{name}`"
    if action.nargs == 0:
        return ", ".join(f"`{flag}`" for flag in action.option_strings)
    value = action.metavar or action.dest.upper()
    if action.nargs == "?":
        value = f"[{value}]"
    return ", ".join(f"`{flag} {value}`" for flag in action.option_strings)


def _help(action: argparse.Action, sub: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own expansion (%(default)s)
        text = sub._get_formatter()._expand_help(action)
    if action.choices and not isinstance(action.choices, dict):
        text += " (one of: " + ", ".join(str(c) for c in action.choices) + ")"
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        text += " (repeatable)"
    unset = action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS)
    if not unset and "default" not in text:  # the default, where the help does not say it
        text += f" (default: {action.default})"
    return _cell(text)


def options_table(command: str) -> str:
    """The Markdown table of ``command``'s arguments, positionals first, as ``--help`` orders them."""
    subs = subparsers()
    if command not in subs:
        raise KeyError(f"no command {command!r}; commands: {', '.join(subs)}")
    sub = subs[command]
    rows = ["| argument | meaning |", "|---|---|"]
    for action in arguments(sub):
        rows.append(f"| {_usage(action)} | {_help(action, sub)} |")
    return "\n".join(rows)


def expand(markdown: str) -> str:
    """``markdown`` with every options marker replaced by its command's table."""
    return MARKER.sub(lambda m: options_table(m.group(1)), markdown)


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    """mkdocs' hook: expand the page's option markers before it is rendered."""
    return expand(markdown)
