"""Compile the native modules against the torch in use.

Three modules (:data:`MODULES`): ``census_scan`` (``census_scan.cpp``), the census's native
reader; ``cuda_stats`` (``cuda_stats.cpp``), the runner's read of the CUDA allocator's
statistics, built for CUDA builds of torch only; ``line_sink`` (``line_sink.cpp``), the
runner's per-line path, which links no torch library (Python's API only).

Each is built once per torch build, Python and source, into the cache folder
(``$GPU_MEM_TRACK_CACHE``, else ``$XDG_CACHE_HOME/gpu_mem_track``, else
``~/.cache/gpu_mem_track``), under ``native/<key>/``. It needs a C++ compiler (``$CXX``,
else ``c++``, ``g++`` or ``clang++``) and the C++ headers that torch's wheels ship
(``torch/include``; no CUDA header, no nvcc); it links against torch's own libraries,
nothing else.

A build writes ``build.log`` next to the module; a failed one leaves ``failed`` there, so
an automatic build is not tried again for that key (``python -m gpu_mem_track.native.build``
always tries). A lock file keeps concurrent processes (the ranks of one launch) from
building the same key twice.

    python -m gpu_mem_track.native.build [--quiet | --background] [--module census_scan|cuda_stats|line_sink]

builds the modules (the CUDA one where torch is a CUDA build), or the one named; exits 0
when what could be built is built (or was), 1 when a build failed, 2 when the census's
module (or the one named) cannot be tried here (no torch, no compiler, no torch headers,
not a CUDA build).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODULES", "BuildPlan", "build", "cache_root", "find_compiler", "main", "plan"]

SOURCE = Path(__file__).with_name("census_scan.cpp")
MODULE = "census_scan"
#: The CUDA allocator's statistics reader (``cuda_stats.cpp``), for CUDA builds of torch.
CUDA_MODULE = "cuda_stats"
#: The runner's line sink (``line_sink.cpp``): Python's C API only.
LINE_MODULE = "line_sink"
#: Each module's name -> the torch libraries it links (besides Python's).
MODULES = {
    MODULE: ("c10", "torch", "torch_cpu", "torch_python"),
    CUDA_MODULE: ("c10", "c10_cuda"),
    LINE_MODULE: (),
}
#: What each module is, in messages.
TITLES = {
    MODULE: "the census's native reader",
    CUDA_MODULE: "the CUDA statistics reader",
    LINE_MODULE: "the runner's native line sink",
}
#: A lock older than this belongs to a build that died: it is taken over.
STALE_LOCK_SECONDS = 900
#: Longest a compile may take before it is stopped and counted as failed.
COMPILE_TIMEOUT_SECONDS = 900


def cache_root() -> Path:
    """The folder the native modules are built into (see the module doc)."""
    given = os.environ.get("GPU_MEM_TRACK_CACHE")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpu_mem_track"


def find_compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else the first of c++, g++, clang++ on PATH."""
    given = os.environ.get("CXX")
    if given:
        return shutil.which(given) or (given if os.path.isfile(given) else None)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class BuildPlan:
    """Where the module of this torch build goes, and what is missing to build it."""

    folder: Path
    module: Path
    torch_version: str
    missing: str  # "" when the build can be tried

    @property
    def built(self) -> bool:
        return self.module.is_file()

    @property
    def failed(self) -> bool:
        return (self.folder / "failed").is_file()


def _torch_facts() -> tuple[str, Path, str, str]:
    import torch

    git = getattr(torch.version, "git_version", "") or ""
    abi = str(int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return torch.__version__, Path(torch.__file__).parent, git, abi


def source(name: str) -> Path:
    """The C++ source of the module ``name``."""
    return SOURCE.with_name(f"{name}.cpp")


def plan(root: Path | None = None, name: str = MODULE) -> BuildPlan:
    """The build plan of the module ``name`` for the torch imported here (imports torch)."""
    version, torch_dir, git, abi = _torch_facts()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    # the libraries' size and time too: a torch rebuilt from the same commit is another build
    libraries = sorted((torch_dir / "lib").glob("libtorch*" if name == MODULE else "lib*"))
    stamps = [f"{lib.name}:{lib.stat().st_size}:{int(lib.stat().st_mtime)}" for lib in libraries]
    facts = [source(name).read_text(), version, git, abi, sys.version, suffix, str(torch_dir), *stamps]
    if name != MODULE:  # census_scan keeps the key it always had
        facts.insert(0, name)
    key = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]
    folder = (root or cache_root()) / "native" / key
    missing = ""
    if not (torch_dir / "include" / "torch" / "csrc" / "autograd" / "python_variable.h").is_file():
        missing = f"torch's C++ headers are not installed ({torch_dir / 'include'})"
    elif name == CUDA_MODULE and _cuda_missing(torch_dir):
        missing = _cuda_missing(torch_dir)
    elif find_compiler() is None:
        missing = "no C++ compiler found (set CXX, or install g++ or clang++)"
    elif sys.platform == "win32":
        missing = "building on Windows is not supported"
    return BuildPlan(folder, folder / f"{name}{suffix}", version, missing)


def _cuda_missing(torch_dir: Path) -> str:
    """Why ``cuda_stats`` cannot be built for this torch ('' when it can)."""
    import torch

    if not getattr(torch.version, "cuda", None) or not list((torch_dir / "lib").glob("libc10_cuda.*")):
        return "this torch is not a CUDA build"
    header = torch_dir / "include" / "c10" / "core" / "CachingDeviceAllocator.h"
    text = header.read_text(errors="replace") if header.is_file() else ""
    if not re.search(r"\b(struct|class)\s+C10_API\s+DeviceAllocator\b", text):
        return f"this torch ({torch.__version__}) has no c10::DeviceAllocator to read the allocator through"
    return ""


def _command(compiler: str, output: Path, standard: str, name: str = MODULE) -> list[str]:
    version, torch_dir, _, abi = _torch_facts()
    include = torch_dir / "include"
    lib = torch_dir / "lib"
    return [
        compiler,
        "-O2",
        "-shared",
        "-fPIC",
        f"-std={standard}",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f'-DGPU_MEM_TRACK_TORCH="{version}"',
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-I{sysconfig.get_paths()['include']}",
        str(source(name)),
        "-o",
        str(output),
        f"-L{lib}",
        *(f"-l{library}" for library in MODULES[name]),
        f"-Wl,-rpath,{lib}",
        *(["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []),
    ]


def build(root: Path | None = None, quiet: bool = True, name: str = MODULE) -> BuildPlan:
    """Build the module ``name`` unless built already; returns the plan (``built`` says
    whether it is there now). Raises nothing for a failed compile: ``failed`` and
    ``build.log`` say."""
    target = plan(root, name)
    if target.built or target.missing:
        return target
    target.folder.mkdir(parents=True, exist_ok=True)
    lock = target.folder / ".lock"
    if not _take_lock(lock):
        return target  # another process is building it
    try:
        compiler = find_compiler()
        assert compiler is not None
        log_lines: list[str] = []
        partial = target.folder / f".{name}.{os.getpid()}.tmp"
        ok = False
        for standard in ("c++17", "c++20"):  # torch's headers need 17 up to 2.x, some 20
            command = _command(compiler, partial, standard, name)
            log_lines.append("$ " + " ".join(command))
            if not quiet:
                print(f"building {TITLES[name]} ({standard}) ...", file=sys.stderr)
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_SECONDS, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                log_lines.append(f"{type(error).__name__}: {error}")
                continue
            log_lines.append(done.stdout + done.stderr)
            if done.returncode == 0 and partial.is_file():
                ok = True
                break
        (target.folder / "build.log").write_text("\n".join(log_lines))
        if ok:
            os.replace(partial, target.module)
            (target.folder / "failed").unlink(missing_ok=True)
        else:
            partial.unlink(missing_ok=True)
            (target.folder / "failed").write_text(f"see {target.folder / 'build.log'}\n")
    finally:
        lock.unlink(missing_ok=True)
    return target


def _take_lock(lock: Path) -> bool:
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - lock.stat().st_mtime < STALE_LOCK_SECONDS:
                    return False
                lock.unlink()  # a build that died: take over
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(str(os.getpid()))
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_mem_track.native.build",
        description="Build the native modules for the torch imported here: the census's reader, "
        "the runner's line sink, and the CUDA statistics reader where torch is a CUDA build.",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing; the exit code says how it went")
    parser.add_argument("--module", choices=sorted(MODULES), help="build only this module")
    parser.add_argument(
        "--background",
        action="store_true",
        help="as --quiet, at low priority (nice 10): a build started by a run, beside it",
    )
    args = parser.parse_args(argv)
    if args.background:
        args.quiet = True
        try:
            os.nice(10)
        except (AttributeError, OSError):  # no nice on this platform: build at full priority
            pass
    say = (lambda *a, **k: None) if args.quiet else print
    try:
        import torch  # noqa: F401
    except ImportError as exc:  # an install from source before torch (pip builds before it installs)
        say(
            f"cannot build {_reader(args.module or MODULE)}: torch is not importable here ({exc})",
            file=sys.stderr,
        )
        return 2
    names = [args.module] if args.module else list(MODULES)
    code = 0
    for name in names:
        target = plan(name=name)
        if target.missing:
            if name == names[0]:  # the one asked for, or the census's: nothing can be done
                say(f"cannot build {_reader(name)}: {target.missing}", file=sys.stderr)
                return 2
            say(f"{TITLES[name]} not built: {target.missing}")
            continue
        target = build(quiet=args.quiet, name=name)
        if target.built:
            say(f"{TITLES[name]} for torch {target.torch_version}: {target.module}")
        else:
            say(f"{TITLES[name]} not built: see {target.folder / 'build.log'}", file=sys.stderr)
            code = 1
    return code


def _reader(name: str) -> str:
    return "the native reader" if name == MODULE else TITLES[name]


if __name__ == "__main__":
    sys.exit(main())
