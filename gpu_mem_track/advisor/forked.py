"""Trials forked from a process that imported torch once.

A trial as ``python -m gpu_mem_track run --simulate ...`` spends its first seconds
importing torch and the simulated GPU (about 3.5 s of a 13 s nanoGPT trial here). A
``multiprocessing`` fork server imports them once (:data:`PRELOAD`); each trial is then a
fork of it that runs the ``gpu_mem_track`` command line in a fresh process of its own
(levers patch torch for the whole process, so trials never share one): the working
folder and environment given, its standard output and error to the trial's log, its
exit code the command's. The fork does not run the caller's ``__main__`` again (as
``multiprocessing`` would for a script without an ``if __name__ == "__main__":`` guard
calling ``gpu_mem_track.fit``). :func:`run_forked` falls back to a plain subprocess where the
platform has no fork server (Windows) or ``GPU_MEM_TRACK_FORKSERVER=off`` says so.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..switches import switched_off

__all__ = ["PRELOAD", "run_forked"]

#: What the fork server imports before it forks: torch (with dynamo, which the simulated GPU
#: imports when it starts), the simulated GPU, the runner.
PRELOAD = [
    "torch",
    "torch._dynamo",
    "gpu_mem_track.simgpu.session",
    "gpu_mem_track.runner.run",
    "gpu_mem_track.cli",
]
_ENV = "GPU_MEM_TRACK_FORKSERVER"
_lock = threading.Lock()
_context: list[object] = []


def _fork_server() -> object | None:
    """The fork server's context (started with its preloads on first use), None where
    there is none."""
    if switched_off(_ENV):
        return None
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    with _lock:
        if not _context:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _context.append(context)
        return _context[0]


def run_forked(argv: Sequence[str], cwd: Path, log: Path, environ: Mapping[str, str] | None = None) -> int:
    """Run ``gpu_mem_track`` with ``argv`` (``["run", ...]``) in ``cwd`` with
    ``environ`` (default: this process's environment), its output to ``log``; its exit
    code."""
    environ = dict(os.environ if environ is None else environ)
    context = _fork_server()
    if context is None:
        with open(log, "wb") as stream:
            command = [sys.executable, "-m", "gpu_mem_track", *argv]
            done = subprocess.run(
                command, cwd=cwd, env=environ, stdout=stream, stderr=subprocess.STDOUT, check=False
            )
            return done.returncode
    process = context.Process(  # type: ignore[attr-defined]
        target=_child, args=(list(argv), str(cwd), environ, str(log)), daemon=False
    )
    with _lock:  # the child must not import the caller's main script again, as spawning does
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            process.start()
        finally:
            sys.modules["__main__"] = main
    try:
        process.join()
    except BaseException:  # Ctrl-C in the advisor: the trial ends with it
        process.terminate()
        process.join()
        raise
    code = process.exitcode
    return 128 - code if code is not None and code < 0 else int(code or 0)


def _child(argv: list[str], cwd: str, environ: dict[str, str], log: str) -> None:
    """In the forked process: the trial's folder, environment and log, then the command."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = ["gpu_mem_track", *argv]
    code: object = 1
    try:  # as ``python -m gpu_mem_track ARGV`` (its __main__ raises SystemExit(code))
        runpy.run_module("gpu_mem_track", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    finally:
        atexit._run_exitfuncs()  # as the interpreter's exit would (the process ends with os._exit)
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)
