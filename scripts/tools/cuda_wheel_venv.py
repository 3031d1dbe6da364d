"""The CUDA-wheel test environment of ``make test-cuda-wheel``: a Python 3.12 venv with
the CUDA build of torch, built once in a cache folder and reused.

Prints the venv's Python on stdout (everything else goes to stderr). The venv is
``--venv``, else ``$CUDA_WHEEL_VENV``, else ``cudawheel312`` in ``$GPU_MEM_TRACK_CACHE``
(else ``$XDG_CACHE_HOME/gpu_mem_track``, else ``~/.cache/gpu_mem_track``: where the
census's native module is built). It is reused as it is when its marker file
(``.gpu_mem_track-ready``) names the same requirements: the marker is written only after
every install succeeded, so an interrupted build is resumed, not trusted. Otherwise the
venv is made with a Python 3.12 (``python3.12`` on PATH, else pyenv's newest 3.12, under
``$PYENV_ROOT`` or ``~/.pyenv``) and the requirements installed with its pip:
``--torch`` (default ``torch==2.13.0``; from PyPI on Linux x86-64 that is the CUDA build,
about 5 GB with its ``nvidia-*`` packages) and what the package and its tests need, read
from ``setup.cfg``: its requirements and its ``dev`` extra (pytest, matplotlib, IPython,
transformers, lightning; not ruff). The package itself is not installed: the tests import
it from the checkout (``PYTHONPATH``). No Python 3.12: one line saying so, exit 2.
Stdlib only, any Python 3.
"""

from __future__ import annotations

import argparse
import configparser
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MARKER = ".gpu_mem_track-ready"
ROOT = Path(__file__).resolve().parents[2]
#: Test extras left out: the linter does not run the tests.
NOT_NEEDED = ("ruff",)


def cache_root() -> Path:
    """The cache folder, as ``gpu_mem_track.native.build.cache_root`` finds it."""
    given = os.environ.get("GPU_MEM_TRACK_CACHE")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpu_mem_track"


def is_312(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.strip() == "True"


def _version_key(path: str) -> tuple[int, ...]:
    name = Path(path).parents[1].name  # .../versions/3.12.7/bin/python3.12
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("."))


def find_python312() -> str | None:
    """``python3.12`` on PATH, else pyenv's newest 3.12 (None when neither runs)."""
    candidates = [shutil.which("python3.12")]
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates += sorted(glob.glob(f"{root}/versions/3.12*/bin/python3.12"), key=_version_key, reverse=True)
    return next((c for c in candidates if c and is_312(c)), None)


def requirements(torch: str, setup_cfg: Path = ROOT / "setup.cfg") -> list[str]:
    """``torch``, then the package's requirements and its ``dev`` extra from ``setup.cfg``
    (what ``make test`` installs), without torch's own line and the linter."""
    config = configparser.ConfigParser()
    config.read(setup_cfg, encoding="utf-8")
    lines = config["options"]["install_requires"].split() + config["options.extras_require"]["dev"].split()
    wanted = [torch]
    for line in lines:
        name = re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0]
        if name != "torch" and name not in NOT_NEEDED and line not in wanted:
            wanted.append(line)
    return wanted


def ready(venv: Path, wanted: list[str]) -> bool:
    marker = venv / MARKER
    python = venv / "bin" / "python"
    return python.exists() and marker.is_file() and marker.read_text().split() == wanted


def build(venv: Path, wanted: list[str]) -> None:
    """Make (or complete) the venv and install ``wanted``; the marker last."""
    python = venv / "bin" / "python"
    if not python.exists():
        base = find_python312()
        if base is None:
            raise SystemExit(
                "test-cuda-wheel: no Python 3.12 found (python3.12 on PATH, or pyenv's versions/3.12.*): "
                "install one (for example `pyenv install 3.12`) and run it again"
            )
        print(f"test-cuda-wheel: making {venv} with {base}", file=sys.stderr)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    (venv / MARKER).unlink(missing_ok=True)
    print(f"test-cuda-wheel: installing {' '.join(wanted)} into {venv}", file=sys.stderr)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", *wanted],
        check=True,
        stdout=sys.stderr,
    )
    (venv / MARKER).write_text(" ".join(wanted) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", help="the venv folder (default: see the module doc)")
    parser.add_argument(
        "--torch", default="torch==2.13.0", help="the torch requirement (default %(default)s)"
    )
    args = parser.parse_args(argv)
    venv = Path(args.venv or os.environ.get("CUDA_WHEEL_VENV") or cache_root() / "cudawheel312")
    wanted = requirements(args.torch)
    if not ready(venv, wanted):
        venv.parent.mkdir(parents=True, exist_ok=True)
        try:
            build(venv, wanted)
        except subprocess.CalledProcessError as exc:
            print(
                f"test-cuda-wheel: {' '.join(map(str, exc.cmd[:4]))} ... failed (exit {exc.returncode})",
                file=sys.stderr,
            )
            return 2
        except SystemExit as exc:
            print(exc, file=sys.stderr)
            return 2
    print(venv / "bin" / "python")
    return 0


if __name__ == "__main__":
    sys.exit(main())
