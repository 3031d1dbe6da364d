"""Report files: safe names, a unique run name or run folder per output folder,
append-and-flush writes.

Report files are created exclusively (``O_CREAT | O_EXCL``: an existing file or symbolic
link, dangling or not, is never reused) and reopened without following symbolic links
(``O_NOFOLLOW``), so a link planted in the reports folder cannot redirect our writes, and
two processes claiming one name at once get two files (``name``, ``name-2``).
"""

from __future__ import annotations

import io
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .errors import UsageError

__all__ = [
    "ReportFiles",
    "claim_folder",
    "claim_name",
    "create_new",
    "default_run_name",
    "open_append",
    "safe_name",
]


_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}


def safe_name(text: str) -> str:
    """``text`` as a file name valid on every OS: letters, digits and ``._-`` only, at most
    100 characters, never starting with ``-`` (a command would read it as an option) and
    never a Windows device name (``CON``, ``NUL``, ...)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).lstrip("._-")[:100].rstrip("._")
    if cleaned.split(".")[0].upper() in _RESERVED:
        cleaned = f"run_{cleaned}"
    return cleaned or "run"


def default_run_name(now: float) -> str:
    """``<script stem>-<YYYYmmdd>-<HHMMSS>`` from ``sys.argv[0]`` and the time ``now``:
    ``stdin-...`` for a program read from standard input (``python -``), ``python-...``
    for ``python -c`` and the interactive interpreter."""
    argv0 = sys.argv[0] if sys.argv else ""
    script = _ARGV0_NAMES.get(argv0) or Path(argv0).stem
    return f"{safe_name(script)}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


_ARGV0_NAMES = {"": "python", "-c": "python", "-": "stdin", "<stdin>": "stdin"}


def claim_name(folder: Path, base: str, claim: Callable[[str], bool]) -> str:
    """Create ``folder`` and return the first of ``base``, ``base-2``, ... that ``claim``
    takes (it returns False for a name an earlier run used). Raises ``UsageError`` when
    the folder cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            name = base if n == 1 else f"{base}-{n}"
            if claim(name):
                return name
    except OSError as exc:
        why = "it is a file, not a folder" if folder.is_file() else exc.strerror or exc
        raise UsageError(f"cannot write reports to {folder}: {why}") from exc
    raise UsageError(f"cannot find a free report name for {base!r} in {folder}")


def claim_folder(
    out_dir: Path, base: str, inner: str = "", skip: Callable[[Path], bool] | None = None
) -> Path:
    """Create and return ``out_dir/<name>`` for the first of ``base``, ``base-2``, ... that
    no earlier run took: a run owns the folder it created (``mkdir`` fails on an existing
    one, so two processes never take the same name). With ``inner``, ``<name>`` is shared
    (a launch folder, created when missing) and ``out_dir/<name>/<inner>`` is claimed and
    returned. ``skip(out_dir/<candidate>)`` True passes a candidate over (a one-process
    run folder where a launch folder is wanted). The claimed folder is checked writable;
    ``UsageError`` when ``out_dir`` cannot be written (see ``claim_name``)."""

    def claim(candidate: str) -> bool:
        parent = out_dir / candidate
        if skip is not None and skip(parent):
            return False
        if inner:
            parent.mkdir(exist_ok=True)
        path = parent / inner if inner else parent
        try:
            path.mkdir()
        except FileExistsError:
            return False
        check = path / ".write-check"  # a folder we may create but not write into fails here
        check.write_text("")
        check.unlink()
        return True

    name = claim_name(out_dir, base, claim)
    return out_dir / name / inner if inner else out_dir / name


@dataclass(frozen=True)
class ReportFiles:
    """The text log and CSV of one run: ``<folder>/<run_name>.log`` and ``.csv``."""

    folder: Path
    run_name: str

    @property
    def log(self) -> Path:
        return self.folder / f"{self.run_name}.log"

    @property
    def csv(self) -> Path:
        return self.folder / f"{self.run_name}.csv"

    @classmethod
    def create(cls, folder: str | Path, run_name: str) -> ReportFiles:
        """Create the folder and claim a run name no earlier run in it used
        (``name``, ``name-2``, ...). Raises ``UsageError`` when the folder is unusable."""
        path = Path(folder)

        def claim(name: str) -> bool:
            files = cls(path, name)
            if not create_new(files.csv):
                return False
            if not create_new(files.log):
                files.csv.unlink()  # ours: created just now
                return False
            return True

        return cls(path, claim_name(path, safe_name(run_name), claim))

    def write_text(self, text: str) -> None:
        """Append ``text`` to the log and close it, so nothing waits in a buffer."""
        with open_append(self.log) as handle:
            handle.write(text)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def create_new(path: Path) -> bool:
    """Create ``path`` empty, atomically; False when a file or symbolic link (even a
    dangling one) already has that name. Other ``OSError`` propagate."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def open_append(path: Path, newline: str | None = None) -> TextIO:
    """``path`` opened to append UTF-8 text (created if missing), refusing a symbolic link
    (``OSError``)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
    try:
        # io.open, not os.fdopen (which imports io: impossible at interpreter shutdown)
        return io.open(fd, "a", encoding="utf-8", newline=newline)  # noqa: UP020
    except BaseException:
        os.close(fd)
        raise
