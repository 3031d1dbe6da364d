"""Where the recordings are, for the check scripts.

The 80 GB GPU snapshots: a folder given on the command line, else
``$GPU_MEM_TRACK_SNAPSHOTS``, else ``shared/fixtures/snapshots`` beside the checkout
(``../shared/fixtures/snapshots``), or one level further up for a worktree kept in a
subfolder. The H200 recordings: a folder given on the command line, else
``shared/fixtures/h200`` found the same way. Never an absolute path of one machine.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def h200_folder(given: Path | None, needs: list[str]) -> Path:
    """The H200 fixture folder holding every path of ``needs`` (relative to it): ``given``,
    else ``shared/fixtures/h200`` beside the checkout or one level further up;
    ``SystemExit`` naming what was looked for when none holds them."""
    beside = [ROOT.parent / "shared/fixtures/h200", ROOT.parent.parent / "shared/fixtures/h200"]
    candidates = [given] if given else beside
    for folder in candidates:
        if all((folder / need).exists() for need in needs):
            return folder
    where = f"--fixtures {given}" if given else "no H200 fixture folder found"
    raise SystemExit(f"{where}: {', '.join(needs)} not there (give the folder with --fixtures)")


def shown(folder: Path) -> str:
    """``folder`` as a report names it, so the committed report holds no path of the
    machine that wrote it: a path in the ``shared`` folder found beside the checkout (or
    one level further up, from a worktree) as ``../shared/...``, as a main checkout sees
    it, whichever of the two wrote the report; any other path relative to the checkout."""
    resolved = folder.resolve()
    for base in (ROOT.parent, ROOT.parent.parent):
        shared = (base / "shared").resolve()
        if shared.is_dir() and (resolved == shared or shared in resolved.parents):
            return (Path("..") / "shared" / resolved.relative_to(shared)).as_posix()
    return os.path.relpath(resolved, ROOT)


def described(folder: Path) -> str:
    """One phrase on what was read: the folder and its snapshot files, and where a README
    in it says they come from."""
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith((".pickle", ".pickle.gz")))
    text = f"{len(files)} snapshot file(s) in `{shown(folder)}/`"
    if (folder / "README.md").is_file():
        text += " (its README.md says where they were recorded)"
    return text
