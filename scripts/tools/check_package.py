"""Build the wheel and the sdist and check that each installs and works in a fresh venv.

    python scripts/tools/check_package.py [--torch "torch==2.13.0"] [--keep DIR]

Steps: a throwaway venv gets ``build`` and runs ``python -m build`` on this checkout;
then, for the wheel and for the sdist, a new venv (no system site packages) gets the torch
requirement and the artifact (from the package index pip is configured with), and, from
a folder outside the checkout, runs:

- ``gpu-mem-track --version`` (must print the version of ``gpu_mem_track/_version.py``);
- ``python -c "import gpu_mem_track"`` (must import from the venv, not the checkout);
- the package data: ``html/report.css``, ``html/report.js``, ``native/census_scan.cpp`` and
  ``py.typed`` installed;
- the demo, ``python -m gpu_mem_track.examples.vgg_demo --device cpu`` (small images);
- ``gpu-mem-track run --html`` on a two-line script (the page embeds the style sheet).

Prints one line per check and exits 1 if any failed. Everything happens under a temporary
folder (``--keep DIR``: there instead, left behind). Needs network access to the package
index, or a local one, for ``build``, setuptools, torch, pandas and tabulate.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sh(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=1200)


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(path)
    return path / "bin" / "python"


def version() -> str:
    """The version the checkout declares (``_version.py``, the one place it is written)."""
    text = (ROOT / "gpu_mem_track" / "_version.py").read_text(encoding="utf-8")
    return re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text).group(1)


def build(work: Path) -> list[Path]:
    """The sdist and the wheel of this checkout, built in a throwaway venv."""
    python = fresh_venv(work / "build-venv")
    for step in (
        [python, "-m", "pip", "install", "-q", "build"],
        [python, "-m", "build", "--outdir", work / "dist", ROOT],
    ):
        done = sh(*step)
        if done.returncode:
            sys.exit(f"{' '.join(map(str, step))} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return sorted((work / "dist").iterdir())


Check = tuple[str, bool, str]


def checks(artifact: Path, work: Path, torch: str) -> list[Check]:
    """Install ``artifact`` and ``torch`` into a new venv and run every check in it."""
    kind = "wheel" if artifact.suffix == ".whl" else "sdist"
    python = fresh_venv(work / f"venv-{kind}")
    scratch = work / f"run-{kind}"
    scratch.mkdir()
    done = sh(python, "-m", "pip", "install", "-q", torch, artifact)
    installed = (f"pip install {torch} {artifact.name}", done.returncode == 0, done.stderr[-500:])
    if done.returncode:
        return [installed]
    tools = (check_version, check_import, check_data, check_demo, check_html)
    return [installed, *(tool(python, scratch, work) for tool in tools)]


def check_version(python: Path, scratch: Path, work: Path) -> Check:
    done = sh(python.parent / "gpu-mem-track", "--version", cwd=scratch)
    return "gpu-mem-track --version", done.stdout.strip() == f"gpu_mem_track {version()}", done.stdout


def check_import(python: Path, scratch: Path, work: Path) -> Check:
    done = sh(python, "-c", "import gpu_mem_track; print(gpu_mem_track.__file__)", cwd=scratch)
    inside = done.stdout.startswith(str(python.parent.parent))  # the venv's copy, not the checkout
    return 'python -c "import gpu_mem_track"', inside, done.stdout + done.stderr


def check_data(python: Path, scratch: Path, work: Path) -> Check:
    code = (
        "from importlib.resources import files; p = files('gpu_mem_track');"
        "print(all((p / n).is_file() for n in ('py.typed', 'html/report.css', 'html/report.js', "
        "'native/census_scan.cpp')))"
    )
    done = sh(python, "-c", code, cwd=scratch)
    found = done.stdout.strip() == "True"
    return "package data (py.typed, report.css, report.js, census_scan.cpp)", found, done.stderr


def check_demo(python: Path, scratch: Path, work: Path) -> Check:
    options = ["--device", "cpu", "--image-size", "32", "--batch", "1", "--run-name", "demo"]
    done = sh(python, "-m", "gpu_mem_track.examples.vgg_demo", *options, "--out-dir", scratch, cwd=scratch)
    ok = done.returncode == 0 and "[gradients released]" in done.stdout
    return "the demo (python -m gpu_mem_track.examples.vgg_demo, CPU)", ok, done.stderr[-500:]


def check_html(python: Path, scratch: Path, work: Path) -> Check:
    (scratch / "two.py").write_text("a = [0] * 100000\nb = len(a)\n", encoding="utf-8")
    cli = python.parent / "gpu-mem-track"
    done = sh(cli, "run", "--html", "--out-dir", scratch, "--run-name", "two", "two.py", cwd=scratch)
    page = scratch / "two" / "report.html"
    ok = done.returncode == 0 and page.is_file() and "svg.chart" in page.read_text(encoding="utf-8")
    return "gpu-mem-track run --html (the page holds its style sheet)", ok, done.stderr[-500:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement to install first")
    parser.add_argument("--keep", type=Path, help="work in this folder and leave it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu_mem_track-package-") as temporary:
        work = args.keep.resolve() if args.keep else Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        failed = 0
        for artifact in build(work):
            print(f"{artifact.name}:")
            for name, ok, detail in checks(artifact, work, args.torch):
                print(f"  {'ok  ' if ok else 'FAIL'} {name}")
                if not ok:
                    failed += 1
                    print("       " + detail.strip().replace("\n", "\n       "))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
