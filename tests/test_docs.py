"""The documentation: README.md and docs/ (the mkdocs site).

- Every option of every command is on some page: the pages' ``<!-- options: NAME -->``
  markers expand (docs/hooks.py, as ``mkdocs build`` expands them) to tables made from the
  CLI's parser, and each argument must appear in the expanded pages with help text. A new
  command without a marker, or an option without help, fails here.
- Paragraphs read in short pieces: no prose paragraph (code blocks, tables and HTML left
  out; each list item its own piece) runs over 6 lines, nor a prose line over 110 characters.
- README.md stays an entrance: at most 250 lines, its first commands ``make demo`` and
  ``make test``, and its links into docs/ lead to pages that exist.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_PARAGRAPH_LINES = 6
MAX_PROSE_WIDTH = 110


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def pages() -> dict[str, str]:
    """Every page of the site, by its path under docs/."""
    return {str(p.relative_to(DOCS)): p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md"))}


def prose_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The prose pieces of a Markdown text, each with its first line's number: paragraphs,
    one piece per list item (with its continuation lines). Fenced code, tables, HTML lines,
    headings and indented code are left out."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 0
    fence = None

    def close() -> None:
        nonlocal current
        if current:
            blocks.append((start, current))
        current = []

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence):
                fence = None
            continue
        match = re.match(r"(`{3,}|~{3,})", stripped)
        if match:
            close()
            fence = match.group(1)
            continue
        if not stripped or stripped.startswith(("|", "<", "#", "!!!", "???")) or line.startswith("    " * 2):
            close()
            continue
        if re.match(r"([-*+]|\d+\.)\s", stripped):  # a list item starts a piece of its own
            close()
        if not current:
            start = number
        current.append(line)
    close()
    return blocks


def test_prose_blocks_splits_as_a_reader_sees_pieces():
    text = "a\nb\n\n- one\n  more\n- two\n\n```\n1\n2\n3\n4\n5\n6\n7\n```\n| t |\n|---|\n"
    assert [(s, len(b)) for s, b in prose_blocks(text)] == [(1, 2), (4, 2), (6, 1)]


def test_every_command_has_a_table_on_some_page():
    markers = {m for text in pages().values() for m in hooks.MARKER.findall(text)}
    commands = set(hooks.subparsers())
    assert commands - markers == set(), "commands without an options table in docs/"
    assert markers - commands == set(), "option markers naming no command"


def test_every_option_of_every_command_appears_with_help():
    expanded = "\n".join(hooks.expand(text) for text in pages().values())
    missing, no_help = [], []
    for name, sub in hooks.subparsers().items():
        rows = hooks.options_table(name).splitlines()[2:]  # in the order of the arguments
        for action, row in zip(hooks.arguments(sub), rows):
            for flag in action.option_strings or [action.metavar or action.dest]:
                if flag not in expanded or flag not in row:
                    missing.append(f"{name} {flag}")
            if not (action.help or "").strip():
                no_help.append(f"{name} {action.dest}")
    assert missing == []
    assert no_help == []


def test_an_options_table_is_one_row_per_argument_and_escapes_markup():
    sub = hooks.subparsers()["fit"]
    table = hooks.options_table("fit").splitlines()
    assert len(table) == 2 + len(hooks.arguments(sub))
    assert "<script>" not in "\n".join(table)  # fit's --out-dir help names fit-<script>-...
    with pytest.raises(KeyError):
        hooks.options_table("no-such-command")


@pytest.mark.parametrize("name", ["README.md", *pages()])
def test_no_prose_paragraph_is_longer_than_six_lines(name):
    text = README.read_text(encoding="utf-8") if name == "README.md" else pages()[name]
    long = [(start, len(block)) for start, block in prose_blocks(text) if len(block) > MAX_PARAGRAPH_LINES]
    wide = [start for start, block in prose_blocks(text) for line in block if len(line) > MAX_PROSE_WIDTH]
    assert long == [], f"{name}: paragraphs over {MAX_PARAGRAPH_LINES} lines (first line, lines)"
    assert wide == [], f"{name}: prose lines over {MAX_PROSE_WIDTH} characters (paragraph's first line)"


def test_readme_is_short_and_starts_with_the_demo_and_the_tests():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"]


def test_readme_links_into_docs_lead_to_pages():
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text(encoding="utf-8"))
    assert links, "the README links into docs/"
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_every_page_is_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", config, re.M))
    assert listed == set(pages())


def test_make_docs_installs_the_docs_extra():
    extras = configparser.ConfigParser()
    extras.read(ROOT / "setup.cfg")
    requirement = extras["options.extras_require"]["docs"].strip()
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"DOCS_REQUIREMENT ?= {requirement}\n" in makefile


def shown_commands() -> list[tuple[str, str]]:
    """Every gpu_mem_track command line in a ``sh`` code block of README.md and docs/, as
    ``(where, the arguments after the program name)``; the comment after ``#`` left out."""
    texts = {"README.md": README.read_text(encoding="utf-8"), **{f"docs/{k}": v for k, v in pages().items()}}
    shown = []
    for where, text in texts.items():
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            for line in block.splitlines():
                match = re.search(r"(?:python -m gpu_mem_track|gpu-mem-track|-m gpu_mem_track) (.*)", line)
                if match:
                    shown.append((where, re.sub(r"\s+#.*$", "", match.group(1)).strip()))
    return shown


def test_every_command_shown_parses():
    """Each command line shown in the docs is one the CLI accepts: its command exists and
    every option is known and well formed (parsed as ``cli.main`` parses, nothing run)."""
    import contextlib
    import io
    import shlex

    from gpu_mem_track.cli import _negative_values, build_parser
    from gpu_mem_track.commands.cmdline import split_script_argv

    shown = shown_commands()
    assert len(shown) > 30
    refused = []
    for where, command in shown:
        parser = build_parser()
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                head, _ = split_script_argv(parser, shlex.split(command))
                parser.parse_args(_negative_values(head))
        except SystemExit:
            refused.append(f"{where}: {command}")
    assert refused == []
