"""The script's own imports of installed packages, made once in the fork server.

Every trial runs the same script, so every trial imports the same libraries: a Hugging
Face Trainer script spends seconds of each trial in ``from transformers import Trainer``
(and what it pulls in: accelerate, the model's module). :func:`script_imports` lists the
top-level ``import X`` and ``from X import a, b`` statements of the script (its text, by
``ast``; relative imports and anything inside functions left out) whose package is
installed (found under a ``site-packages`` or ``dist-packages`` folder: not the script's
own modules, which may do work on import). ``forked`` passes them to the fork server in
the environment variable :data:`ENV` (JSON) and the server imports ``serverimports``
among its preloads, which calls :func:`make_imports`: those imports (each name of a
``from`` import is looked up, which loads a lazily imported module such as
``transformers.Trainer``), a failure ignored (the trial then imports it itself, as
without the fork server). Importing this module imports nothing else;
``GPU_MEM_TRACK_FIT_PRELOAD=off`` turns the preload of the script's imports off.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
from pathlib import Path

__all__ = ["ENV", "make_imports", "script_imports"]

#: The environment variable holding the imports for the fork server: JSON ``[[module, [names]], ...]``.
ENV = "GPU_MEM_TRACK_FIT_IMPORTS"


def script_imports(script: str | os.PathLike[str]) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` for each top-level import of installed packages in ``script``
    (``names`` empty for ``import X``); [] when the script cannot be read or parsed."""
    path = Path(script)
    if path.is_dir():
        path = path / "__main__.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, tuple(a.name for a in node.names if a.name != "*")))
    return [(module, names) for module, names in found if _installed(module)]


def _installed(module: str) -> bool:
    """Whether ``module``'s top package is an installed one (not ours, not a local file)."""
    top = module.split(".")[0]
    if top == "gpu_mem_track":
        return False
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = (spec.origin or "") if spec is not None else ""
    if not origin and spec is not None and spec.submodule_search_locations:
        origin = next(iter(spec.submodule_search_locations), "")
    return "site-packages" in origin or "dist-packages" in origin


def make_imports() -> None:
    """In the fork server: the imports :data:`ENV` names (failures ignored)."""
    try:
        wanted = json.loads(os.environ.get(ENV, "[]"))
    except ValueError:
        return
    for module, names in wanted:
        try:
            loaded = importlib.import_module(module)
            for name in names:
                getattr(loaded, name, None)
        except Exception:  # noqa: BLE001 - the trial imports it itself, as without a preload
            continue
