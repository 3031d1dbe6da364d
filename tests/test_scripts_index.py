"""scripts/: every script has its line in the index (scripts/README.md), every line names a
script that is there, and the scripts import each other only within their folder or from
scripts/_common/, with no circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
SHARED = "_common"


def _scripts() -> list[str]:
    return sorted(
        p.relative_to(SCRIPTS).as_posix() for p in SCRIPTS.rglob("*.py") if "__pycache__" not in p.parts
    )


def _index() -> dict[str, str]:
    """The index's lines: ``- `FOLDER/NAME.py`: purpose``, path to purpose."""
    text = (SCRIPTS / "README.md").read_text()
    return dict(re.findall(r"^- `([^`]+\.py)`: *(.*)$", text, re.MULTILINE))


def test_every_script_has_a_line_with_its_purpose_in_the_index_and_every_line_a_script():
    index, scripts = _index(), _scripts()
    assert sorted(set(scripts) - set(index)) == [], "scripts missing from scripts/README.md"
    assert sorted(set(index) - set(scripts)) == [], "scripts/README.md names scripts that are not there"
    assert [path for path, purpose in index.items() if len(purpose) < 20] == []
    assert all("/" in path for path in scripts), "a script at the top of scripts/: give it a folder"


def _imports(path: Path) -> set[str]:
    """The scripts ``path`` imports (as paths under scripts/): a bare name that is a script
    of its own folder (``sys.path[0]`` when it runs), or ``_common.NAME``; also a bare name
    that is a script of another folder, which the test then refuses."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    found = set()
    by_name: dict[str, list[str]] = {}
    for script in _scripts():
        by_name.setdefault(Path(script).stem, []).append(script)
    folder = path.parent.relative_to(SCRIPTS).as_posix()
    for name in names:
        if name.startswith(f"{SHARED}."):
            target = f"{SHARED}/{name.split('.')[1]}.py"
            if target in by_name.get(name.split(".")[1], []):
                found.add(target)
        elif "." not in name and name in by_name:
            own = f"{folder}/{name}.py"
            found.add(own if own in by_name[name] else by_name[name][0])
    return found


def test_scripts_import_within_their_folder_or_from_common_and_in_no_circle():
    edges = {script: _imports(SCRIPTS / script) for script in _scripts()}
    across = [
        f"{a} -> {b}"
        for a, targets in edges.items()
        for b in targets
        if b.split("/")[0] not in (a.split("/")[0], SHARED)
        or (a.startswith(SHARED) and not b.startswith(SHARED))
    ]
    assert across == []
    # Depth-first search for a back edge.
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif not state.get(nxt):
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(edges):
        if not state.get(start):
            visit(start, [start])
    assert circles == []
    # The GPU check's parts are where the circle was: they import downwards only.
    assert edges["gpu/gpu_check_report.py"] == set() and edges["gpu/gpu_check_clock.py"] == set()
