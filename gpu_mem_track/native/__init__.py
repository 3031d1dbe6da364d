"""Native code, built on the user's machine against the torch they have.

Three modules. ``census_scan`` (``census_scan.cpp``), the census's native reader (this
module loads it), reads each plain tensor's storage, shape, dtype, device and flags in one C++ pass, where
the same reads through torch's Python bindings cost 85-190 ns each: with it a census of
100,000 small tensors costs about what a bare ``gc.get_objects()`` does, without it
several times more (``reports/bench_census_tensors.md``). The census gives the same
result either way (``tests/test_native_census.py`` compares them). ``cuda_stats``
(``cuda_stats.cpp``, CUDA builds of torch only), the runner's read of the CUDA allocator's
statistics without torch's dict, is loaded and checked by :mod:`.cudastats`. ``line_sink``
(``line_sink.cpp``, Python's C API only), the runner's per-line path, is loaded by
:mod:`.linesink` and used by ``runner.profiler`` wherever it is built.

Each module is built (``build.py``) into the user's cache folder, once per torch build and
Python: by an install from source (``setup.py`` runs ``python -m gpu_mem_track.native.build``;
a binary wheel compiles nothing at install), by that command itself (or ``make native``),
or else in the background, in a process of its own at low priority, the first time it is
wanted (:func:`start_build`; a failed build is not tried again):

- ``census_scan``: when a census first meets :data:`AUTO_BUILD_TENSORS` plain tensors
  (about 20 s of one core); censuses use it once it is there;
- ``line_sink``: when a run starts and finds it missing (a few seconds); that run traces
  through Python, the runs after it natively;
- ``cuda_stats``: when a CUDA run finds it missing; that run reads torch's dict until the
  build has ended, and the native reader from then on.

Concurrent processes (the ranks of one launch, two runs) build a module once: the build
takes a lock file and moves the finished module into place in one rename
(``build.build``); a process that finds another's build running keeps its Python path
until it has ended (:func:`build_running`).

``GPU_MEM_TRACK_NATIVE`` chooses: ``auto`` (the default, as above), ``off`` (never load
nor build any module: the census reads through Python only, the runner traces through
Python and reads torch's statistics dict). Without a C++ compiler or torch's
headers, or when the built module does not match the torch in use, the Python paths are
used and each module's ``status()`` says why.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..switches import switched_off

__all__ = [
    "AUTO_BUILD_TENSORS",
    "build_now",
    "build_running",
    "census_scan",
    "load_built",
    "load_once",
    "load_planned",
    "loaded",
    "mode",
    "request_background",
    "request_build",
    "start_build",
    "status",
    "use",
]

#: Tensors found by one census from which an automatic build starts.
AUTO_BUILD_TENSORS = 20_000
#: The ABI number of census_scan.cpp this Python code speaks.
ABI = 2

_lock = threading.Lock()
_state: dict[str, Any] = {
    "loaded": False,
    "module": None,
    "note": "not loaded yet",
    "requested": False,
    "builder": None,
}


def mode() -> str:
    """``"auto"`` or ``"off"`` (``GPU_MEM_TRACK_NATIVE``; anything else counts as auto)."""
    return "off" if switched_off("GPU_MEM_TRACK_NATIVE") else "auto"


def census_scan() -> ModuleType | None:
    """The native census reader, or None (off, not built, or not matching this torch).

    Looked for once per process, and once more when a build this process started in the
    background has ended: a module built while the program runs is used from then on."""
    return load_once(_state, _lock, _load, _being_built, done="loaded")


def _being_built() -> bool:
    builder = _state["builder"]
    return builder is not None and builder.poll() is None


def loaded() -> ModuleType | None:
    """The native census reader if already loaded (never looks for it)."""
    return _state["module"]


def _load(path: Path | None = None) -> tuple[ModuleType | None, str]:
    try:
        from . import build
    except Exception as error:  # pragma: no cover - our own module
        return None, f"cannot plan the build: {error}"
    try:
        target = build.plan()
    except Exception as error:
        return None, f"cannot plan the build: {type(error).__name__}: {error}"
    module_path = path or target.module
    if not module_path.is_file():
        if target.failed:
            return None, f"its build failed: see {target.folder / 'build.log'}"
        return None, target.missing or "not built (python -m gpu_mem_track.native.build builds it)"
    module, problem = load_built(build.MODULE, module_path, ABI, target.torch_version)
    if module is None:
        return None, problem
    problem = _self_check(module)
    if problem:
        return None, f"{module_path} disagrees with torch: {problem}"
    return module, f"loaded from {module_path}"


def load_built(name: str, path: Path, abi: int, torch_version: str) -> tuple[ModuleType | None, str]:
    """Import the built module ``name`` from ``path`` and check that it speaks ``abi`` and
    was built for torch ``torch_version``: (the module, ``""``), or (None, why not)."""
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as error:
        return None, f"cannot load {path}: {type(error).__name__}: {error}"
    if getattr(module, "ABI", None) != abi or getattr(module, "TORCH", None) != torch_version:
        return None, f"{path} was built for another version"
    return module, ""


def load_once(
    state: dict[str, Any],
    lock: threading.Lock,
    load: Callable[[], tuple[ModuleType | None, str]],
    busy: Callable[[], bool] | None = None,
    done: str = "looked",
) -> ModuleType | None:
    """The built module a native module's ``state`` holds (keys ``module``, ``note`` and
    ``done``), looked for once: None with ``GPU_MEM_TRACK_NATIVE=off`` (noted), None while
    ``busy()`` (a build is running; looked for on a later call), else ``load()``'s module
    (kept with its note, ``state[done]`` set so that it is not looked for again until a
    caller clears it)."""
    if state["module"] is not None:
        return state["module"]
    if mode() == "off":
        state["note"] = "off (GPU_MEM_TRACK_NATIVE=off)"
        return None
    with lock:
        if not state[done]:
            if busy is not None and busy():
                return None
            state["module"], state["note"] = load()
            state[done] = True
    return state["module"]


def load_planned(name: str, abi: int, loaded_note: str) -> tuple[ModuleType | None, str]:
    """Load the module ``name`` (``build.MODULES``) from where ``build.plan`` puts it:
    (the module, ``loaded_note`` with ``{path}`` filled in), or (None, why not: not built
    and why, its build failed, or :func:`load_built`'s reason)."""
    try:
        from . import build

        target = build.plan(name=name)
    except Exception as error:
        return None, f"cannot plan the build: {type(error).__name__}: {error}"
    if not target.module.is_file():
        if target.missing:
            return None, f"not built: {target.missing}"
        if target.failed:
            return None, f"its build failed: see {target.folder / 'build.log'}"
        return None, "not built (make native, or python -m gpu_mem_track.native.build, builds it)"
    module, problem = load_built(name, target.module, abi, target.torch_version)
    if module is None:
        return None, problem
    return module, loaded_note.format(path=target.module)


def _self_check(module: ModuleType) -> str:
    """Compare the module's reading of a few tensors with torch's own; '' when equal."""
    import torch

    base = torch.zeros(3, 4)
    view = base[1:]
    parameter = torch.nn.Parameter(torch.ones(5, dtype=torch.float16), requires_grad=False)
    leaf = torch.ones(2, requires_grad=True)
    leaf.grad = torch.zeros(2)  # a leaf with a gradient, counted with it
    objects = [base, view, parameter, leaf, "not a tensor"]
    try:
        scan = module.Scan(objects, torch.Tensor, torch.nn.Parameter, "cpu", None, 3)
        codes = list(scan.codes())
        moved = scan.settle(set(), set(), set())
        entries, _, gradients = scan.groups(6, 0, {})
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    # the leaf and its gradient (kind 3), which is not among the objects
    expected = [(0, 6, (3, 4), 48, 1), (2, 0, (5,), 10, 1), (3, 3, (2,), 8, 1), (3, 6, (2,), 8, 1)]
    if (
        codes != [1, 1, 1, 1, 2]
        or moved != []
        or scan.views != 1
        or sorted(entries) != expected
        or gradients != {id(leaf): [e[1] for e in entries].index(3)}
    ):
        return f"read {codes}, {moved}, {scan.views}, {entries}, {gradients}"
    return ""


def build_now(quiet: bool = True) -> ModuleType | None:
    """Build the module here and now unless built (waits for the compiler), then load it.
    None when off, or when it cannot be built or loaded (``status()`` says why)."""
    if mode() == "off":
        return census_scan()
    from . import build

    try:
        build.build(quiet=quiet)
    except Exception as error:
        _state["note"] = f"cannot build: {type(error).__name__}: {error}"
        return None
    with _lock:
        _state.update(loaded=False, builder=None)
    return census_scan()


def status() -> str:
    """One line: whether the native reader is in use, and why not."""
    census_scan()
    return str(_state["note"])


def request_build() -> bool:
    """Start building the module in the background (once per process, ``auto`` mode only,
    never when a build failed before). True when a build was started."""
    if mode() == "off" or _state["requested"] or _state["module"] is not None:
        return False
    _state["requested"] = True
    builder = start_build()
    if builder is None:
        return False
    with _lock:
        _state["builder"] = builder
        _state["loaded"] = False  # look again once the build has ended
        _state["note"] = "being built in the background"
    return True


def request_background(state: dict[str, Any], lock: threading.Lock, start: Callable[[], Any]) -> bool:
    """Start a native module's background build with ``start()`` (:func:`start_build` for
    that module, or a test's fake): once per process (``state["requested"]``), never with
    ``GPU_MEM_TRACK_NATIVE=off`` nor once the module is loaded. The builder goes to
    ``state["builder"]`` and ``state["looked"]`` is cleared, so that :func:`load_once`
    looks for the module again once :func:`build_running` says the build has ended. True
    when a build was started."""
    if mode() == "off" or state["requested"] or state["module"] is not None:
        return False
    state["requested"] = True
    builder = start()
    if builder is None:
        return False
    with lock:
        state.update(builder=builder, looked=False, note="being built in the background")
    return True


def build_running(state: dict[str, Any], name: str) -> bool:
    """Whether the background build this process started for the module ``name``
    (``state["builder"]``) is still running, or, after it was started, another process
    (another rank, another run) holds that build's lock (``build.build`` takes it; a lock
    older than ``build.STALE_LOCK_SECONDS`` belongs to a build that died)."""
    builder = state["builder"]
    if builder is None:
        return False
    if builder.poll() is None:
        return True
    try:
        from . import build

        return _fresh(build.plan(name=name).folder / ".lock")
    except Exception:  # no plan: nobody is building it
        return False


def start_build(name: str = "census_scan") -> subprocess.Popen[bytes] | None:
    """A background process building the module ``name`` (``build.MODULES``), detached from
    this one's terminal and output, at low priority (``--background``); a stand-in whose
    ``poll()`` says whether it is still running when another process holds that build's
    lock; None when it is built, failed before, cannot be built here, or the process could
    not start."""
    try:
        from . import build

        target = build.plan(name=name)
        if target.built or target.failed or target.missing:
            return None
        lock = target.folder / ".lock"
        if _fresh(lock):  # another process (a rank, another run) is building it: no second one
            return _BuiltElsewhere(lock)
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH", "")]))
        command = [sys.executable, "-m", "gpu_mem_track.native.build", "--background"]
        return subprocess.Popen(
            command if name == build.MODULE else [*command, "--module", name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except Exception:
        return None


def _fresh(lock: Path) -> bool:
    """Whether ``lock`` is held by a build that is alive (younger than
    ``build.STALE_LOCK_SECONDS``)."""
    from . import build

    try:
        return time.time() - lock.stat().st_mtime < build.STALE_LOCK_SECONDS
    except OSError:
        return False


class _BuiltElsewhere:
    """:func:`start_build`'s builder when another process holds the build's lock: running
    (``poll()`` None) while that lock is fresh, as a ``subprocess.Popen`` is while it runs."""

    def __init__(self, lock: Path) -> None:
        self.lock = lock

    def poll(self) -> int | None:
        return None if _fresh(self.lock) else 0


class use:
    """Context manager for tests and benchmarks: make ``census_scan()`` return ``module``
    (None: the Python path) inside the block."""

    def __init__(self, module: ModuleType | None) -> None:
        self.module = module
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> ModuleType | None:
        self._saved = dict(_state)
        _state.update(
            loaded=True,
            module=self.module,
            note="given" if self.module else "disabled",
            requested=True,
            builder=None,
        )
        return self.module

    def __exit__(self, *exc: object) -> None:
        _state.clear()
        _state.update(self._saved)
