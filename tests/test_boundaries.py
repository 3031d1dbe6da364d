"""The package's boundaries: which part may import which, which import no torch, and the
public names ``gpu_mem_track`` exports."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpu_mem_track

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpu_mem_track"

#: The data model and the small shared modules: plain records and text, never torch.
MODEL_MODULES = (
    "gpu_mem_track.categories",
    "gpu_mem_track.csvrows",
    "gpu_mem_track.devices",
    "gpu_mem_track.dtypes",
    "gpu_mem_track.errors",
    "gpu_mem_track.inputs",
    "gpu_mem_track.outputs",
    "gpu_mem_track.units",
    "gpu_mem_track.tracker.records",
    "gpu_mem_track.runfolder.records",
    "gpu_mem_track.dispatch.records",
    "gpu_mem_track.estimator.records",
    "gpu_mem_track.estimator.options",
)

#: Renderers the records may call lazily (``_repr_html_``): torch-free, model imports only.
MODEL_RENDERERS = ("gpu_mem_track.html", "gpu_mem_track.html.tables")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(*folders: str) -> list[str]:
    """Every module of ``gpu_mem_track/<folder>`` (the package itself for ``""``)."""
    found = []
    for folder in folders:
        where = PACKAGE / folder
        found += [module_name(p) for p in sorted(where.glob("*.py"))]
    return found


def imports(path: Path, source: str | None = None, typing: bool = False) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions, with relative
    imports resolved; ``from x import y`` counts as both ``x`` and ``x.y`` (y may be a
    module). Imports under ``if TYPE_CHECKING:`` are left out (they never run) unless
    ``typing``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text)
    for node in list(ast.walk(tree)) if typing else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The module of ``from ... import`` in ``package``, a relative one resolved."""
    if not node.level:
        return node.module or ""
    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*parent, *([node.module] if node.module else [])])


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (its ``else`` runs)."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    return [node for node in ast.walk(tree) if id(node) not in skipped]


@functools.cache
def package_imports(path: Path, typing: bool = False) -> frozenset[str]:
    """``imports(path, typing=typing)`` of a package file, read once per test session."""
    return frozenset(imports(path, typing=typing))


def offenders(folder: str, forbidden: tuple[str, ...], typing: bool = False) -> dict[str, list[str]]:
    """Modules under ``folder`` importing any module under one of ``forbidden`` (with
    ``typing``, under ``if TYPE_CHECKING:`` too)."""
    bad, under = {}, tuple(f"{name}." for name in forbidden)
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        hits = sorted(m for m in package_imports(path, typing) if m in forbidden or m.startswith(under))
        if hits:
            bad[module_name(path)] = hits
    return bad


def torch_importers(names: list[str]) -> list[str]:
    """Import ``names`` in turn in a fresh interpreter; those after which torch appeared
    (each one's own imports counted, as far as earlier ones had not already done them)."""
    code = (
        "import importlib, json, sys\n"
        "guilty = []\n"
        "for name in sys.argv[1:]:\n"
        "    had = 'torch' in sys.modules\n"
        "    importlib.import_module(name)\n"
        "    if not had and 'torch' in sys.modules:\n"
        "        guilty.append(name)\n"
        "print(json.dumps(guilty))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_runner_runs_model_and_cli_import_no_torch():
    """The runner must not start torch (or CUDA) before the user's script does; reading
    runs back, the records and the command line (``--help``) need no torch at all."""
    # --memory tensors' dispatch mode is torch: run.py imports it only when that is chosen.
    chosen = "gpu_mem_track.runner.tensorbytes"
    names = [
        "gpu_mem_track",
        *MODEL_MODULES,
        *MODEL_RENDERERS,
        *(
            name
            for name in modules("runfolder", "snapshotfile", "runner", "runs", "commands")
            if name != chosen
        ),
        "gpu_mem_track.cli",
    ]
    assert torch_importers(names) == []


def test_the_gpu_catalog_and_the_gpu_model_tables_import_no_torch():
    """The runner and the ``gpus`` command list GPUs and read records without torch."""
    names = [
        "gpu_mem_track.simgpu",
        "gpu_mem_track.simgpu.catalog",
        "gpu_mem_track.simgpu.records",
        "gpu_mem_track.gpumodel",
        "gpu_mem_track.gpumodel.workspace",
        "gpu_mem_track.gpumodel.differences",
    ]
    assert torch_importers(names) == []


def test_estimator_imports_neither_tracker_nor_runner():
    assert offenders("estimator", ("gpu_mem_track.tracker", "gpu_mem_track.runner")) == {}


def test_the_simulated_gpu_sits_below_the_estimator():
    """The simulated GPU is a device: the estimator runs on it, never the reverse. What
    both use (storage lifetimes, device memories, known values) is ``dispatch``, a floor
    below both that imports neither; the runner reaches it there, not in the estimator.
    Imports read only by type checkers count too: they are arrows of the design."""
    above = ("gpu_mem_track.estimator", "gpu_mem_track.runner", "gpu_mem_track.tracker")
    assert offenders("simgpu", above, typing=True) == {}
    assert offenders("dispatch", (*above, "gpu_mem_track.simgpu"), typing=True) == {}
    assert offenders("runner", ("gpu_mem_track.estimator",), typing=True) == {}


def test_the_run_folder_format_imports_none_of_its_producers_or_readers():
    """``runfolder`` is the run folder's format: the runner, the snapshot reader and the
    notebook write it, ``runs`` and ``html`` read it; it imports none of them (and no torch,
    checked above)."""
    users = ("runner", "runs", "snapshots", "html", "notebook", "tracker", "estimator")
    assert offenders("runfolder", tuple(f"gpu_mem_track.{name}" for name in users)) == {}


def test_the_allocator_model_and_the_snapshot_format_import_no_snapshot_report():
    """One model of the GPU: ``snapshots`` (the report) uses ``allocator``, never the
    reverse; the snapshot file format (``snapshotfile``) imports neither."""
    assert offenders("allocator", ("gpu_mem_track.snapshots",)) == {}
    assert offenders("snapshotfile", ("gpu_mem_track.snapshots", "gpu_mem_track.allocator")) == {}


def test_tracker_imports_no_runner_and_runs_no_estimator():
    assert offenders("tracker", ("gpu_mem_track.runner",)) == {}
    assert offenders("runs", ("gpu_mem_track.estimator",)) == {}


def test_only_main_imports_the_command_line():
    forbidden = ("gpu_mem_track.cli", "gpu_mem_track.commands")
    bad = {
        name: hits
        for name, hits in offenders("", forbidden).items()  # the whole package
        if name not in ("gpu_mem_track.__main__", "gpu_mem_track.cli") and not name.startswith(forbidden[1])
    }
    assert bad == {}


def test_model_modules_import_nothing_that_measures():
    """Records import only the standard library and other model modules."""
    allowed = set(MODEL_MODULES) | set(MODEL_RENDERERS)
    for name in MODEL_MODULES + MODEL_RENDERERS:
        path = ROOT / (name.replace(".", "/") + ".py")
        path = path if path.is_file() else path.with_suffix("") / "__init__.py"
        ours = {m for m in package_imports(path) if m.startswith("gpu_mem_track")}
        strays = {m for m in ours if m not in allowed and m.rpartition(".")[0] not in allowed}
        assert strays == set(), name


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports: every import, at
    module level, inside functions or under ``if TYPE_CHECKING:`` (a circle is a knot of
    the design however late its import runs). ``from x import y`` counts as ``x.y`` when
    that is a module, else as ``x``; the parent packages Python runs on the way are not
    counted."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = from_module(node, package)
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names)
        graph[name] = {m for m in found if m in paths} - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each set of two or more modules that reach each
    other (a strongly connected component, Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def in_the_command_registry(circle: list[str]) -> bool:
    """``commands`` is a registry: its ``__init__`` lists the subcommands by importing them
    when asked, and each takes ``Command`` from it. That circle stays inside ``commands``."""
    return all(m == "gpu_mem_track.commands" or m.startswith("gpu_mem_track.commands.") for m in circle)


def test_the_package_has_no_import_circles_but_the_known_ones():
    """No two modules import each other, directly or around a loop (the simulated GPU's
    session, CUDA API, ranks and snapshot once did, as did the allocator with its state
    and the notebook's records with their text): counted as :func:`import_graph`
    reads imports, lazy and type-checking ones included."""
    found = circles(import_graph())
    assert [circle for circle in found if not in_the_command_registry(circle)] == []


def test_the_circle_finder_finds_loops_and_only_loops():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": {"g"}}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_lazy_and_type_checking_imports_and_resolves_submodules():
    graph = import_graph()
    # notebook.records imports render inside a method; simgpu.cudaapi imports running
    # under TYPE_CHECKING; ``from . import face`` in simgpu.ranks names the module face.
    assert "gpu_mem_track.notebook.render" in graph["gpu_mem_track.notebook.records"]
    assert "gpu_mem_track.simgpu.running" in graph["gpu_mem_track.simgpu.cudaapi"]
    assert "gpu_mem_track.simgpu.face" in graph["gpu_mem_track.simgpu.ranks"]
    assert "gpu_mem_track.simgpu" not in graph["gpu_mem_track.simgpu.ranks"]
    assert "gpu_mem_track.allocator" in graph["gpu_mem_track.simgpu.engine"]


def test_the_import_scanner_sees_relative_and_lazy_imports_but_not_type_checking_ones():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .records import A\n"
        "if TYPE_CHECKING:\n"
        "    from ..runner import run\n"
        "def f():\n"
        "    from ..tracker import census\n"
        "    import torch\n"
    )
    found = imports(PACKAGE / "estimator" / "records.py", source)
    assert {"gpu_mem_track.estimator.records.A", "gpu_mem_track.tracker.census", "torch"} <= found
    assert not any(m.startswith("gpu_mem_track.runner") for m in found)


def test_every_exported_name_resolves():
    """In a fresh interpreter: the callbacks import their frameworks, whose module-level
    tensors would stay in this process and show in other tests' censuses."""
    code = (
        "import json, gpu_mem_track as g\n"
        "print(json.dumps([n for n in g.__all__ if getattr(g, n) is None or n not in dir(g)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_every_exported_name_is_one_the_docs_show():
    """``__all__`` is what a user calls: each name appears in the README or a page of
    docs/; the records, readers and plumbing stay importable from their subpackages."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    shown = set(re.findall(r"[A-Za-z_]+", "\n".join(p.read_text(encoding="utf-8") for p in texts)))
    unshown = [name for name in gpu_mem_track.__all__ if name != "__version__" and name not in shown]
    assert unshown == []
    assert "PreparedRun" not in gpu_mem_track.__all__ and "full_scan" not in gpu_mem_track.__all__


@pytest.mark.slow
def test_the_torch_check_names_the_module_that_imported_torch():
    names = ["gpu_mem_track.units", "gpu_mem_track.gpumodel.autocast", "gpu_mem_track.tracker.census"]
    assert torch_importers(names) == ["gpu_mem_track.gpumodel.autocast"]


def test_the_type_checking_block_imports_every_exported_name():
    """Type checkers see ``__all__`` through the ``TYPE_CHECKING`` imports; the lazy table
    and ``__all__`` name the same things."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    typed = {alias.asname or alias.name for node in block.body for alias in node.names}
    assert typed | {"__version__"} == set(gpu_mem_track.__all__)
    assert set(gpu_mem_track._HOMES) | {"__version__"} == set(gpu_mem_track.__all__)


def test_make_test_installs_the_notebook_extra_so_its_tests_run():
    """``make test`` installs ``.[dev]`` when a module it checks for is missing: ``dev``
    holds the ``notebook`` extra and the Makefile checks for it (else those tests skip)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    extras = config["options.extras_require"]
    notebook, dev = (set(extras[name].split()) for name in ("notebook", "dev"))
    assert notebook <= dev
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert all(f"'{module}'" in makefile for module in ("IPython", "ipykernel", "nbclient", "nbformat"))
