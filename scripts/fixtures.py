"""Where the recorded snapshots are, for the check scripts.

A folder given on the command line, else ``$GPU_MEM_TRACK_SNAPSHOTS``, else
``shared/fixtures/snapshots`` beside the checkout (``../shared/fixtures/snapshots``), or one
level further up for a worktree kept in a subfolder. Never an absolute path of one machine.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The environment variable naming the snapshot folder.
ENV = "GPU_MEM_TRACK_SNAPSHOTS"


def fixtures_folder(given: Path | None = None) -> Path:
    """The snapshot folder to read (see the module docstring); ``SystemExit`` naming the
    ways to give one when none is found."""
    candidates = [given] if given else []
    if os.environ.get(ENV):
        candidates.append(Path(os.environ[ENV]))
    candidates += [
        ROOT.parent / "shared/fixtures/snapshots",
        ROOT.parent.parent / "shared/fixtures/snapshots",
    ]
    for folder in candidates:
        if folder.is_dir():
            return folder
    if given:
        raise SystemExit(f"no such snapshot folder: {given}")
    raise SystemExit(f"no snapshot folder found: give one, or set {ENV}")


def shown(folder: Path) -> str:
    """``folder`` as a report names it: relative to the checkout when it can be, so the
    committed report holds no path of the machine that wrote it."""
    return os.path.relpath(folder.resolve(), ROOT)


def described(folder: Path) -> str:
    """One phrase on what was read: the folder and its snapshot files, and where a README
    in it says they come from."""
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith((".pickle", ".pickle.gz")))
    text = f"{len(files)} snapshot file(s) in `{shown(folder)}/`"
    if (folder / "README.md").is_file():
        text += " (its README.md says where they were recorded)"
    return text
