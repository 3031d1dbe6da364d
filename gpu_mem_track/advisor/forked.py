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

Each trial is the leader of its own process group (its DataLoader workers and anything
else it starts join it), so :func:`stop_all` (fit interrupted: Ctrl-C, SIGTERM, SIGHUP)
ends every trial's whole group (SIGTERM, which the runner unwinds like Ctrl-C; SIGKILL
after ``grace`` seconds), refuses new trials (:class:`Stopped`) and stops the fork
server, so no process of fit's is left behind.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..switches import switched_off

__all__ = ["PRELOAD", "Stopped", "close_server", "preload_script_imports", "run_forked", "stop_all"]

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
_IMPORTS = "GPU_MEM_TRACK_FIT_PRELOAD"
_lock = threading.Lock()
_context: list[object] = []
_extra: list[str] = []  # the preload of the script's imports, when asked for
_live: dict[int, object] = {}  # pid -> the running trial's Process or Popen
_stopping: list[bool] = [False]


class Stopped(Exception):
    """A trial asked for after :func:`stop_all`: it is not started."""


def preload_script_imports(script: str | os.PathLike[str]) -> None:
    """Have the fork server also import ``script``'s imports of installed packages
    (``preload``), when it has not started yet and ``GPU_MEM_TRACK_FIT_PRELOAD`` is not
    ``off``: every trial then starts with them imported."""
    if switched_off(_IMPORTS):
        return
    from .preload import ENV, script_imports

    with _lock:
        if _context:  # the server of an earlier fit in this process: as it is
            return
        imports = script_imports(script)
        if imports:
            os.environ[ENV] = json.dumps(imports)
            _extra[:] = ["gpu_mem_track.advisor.serverimports"]


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
            context.set_forkserver_preload(PRELOAD + _extra)
            _context.append(context)
        return _context[0]


def run_forked(argv: Sequence[str], cwd: Path, log: Path, environ: Mapping[str, str] | None = None) -> int:
    """Run ``gpu_mem_track`` with ``argv`` (``["run", ...]``) in ``cwd`` with
    ``environ`` (default: this process's environment), its output to ``log``; its exit
    code. :class:`Stopped` once :func:`stop_all` was called."""
    environ = dict(os.environ if environ is None else environ)
    context = _fork_server()
    if context is None:
        return _run_subprocess(argv, cwd, log, environ)
    process = context.Process(  # type: ignore[attr-defined]
        target=_child, args=(list(argv), str(cwd), environ, str(log)), daemon=False
    )
    with _lock:  # the child must not import the caller's main script again, as spawning does
        if _stopping[0]:
            raise Stopped("fit was interrupted")
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            process.start()
        finally:
            sys.modules["__main__"] = main
        _live[process.pid] = process
    try:
        process.join()
    except BaseException:  # Ctrl-C in the advisor: the trial ends with it
        _end_group(process.pid, signal.SIGTERM)
        process.join()
        raise
    finally:
        with _lock:
            _live.pop(process.pid, None)
    code = process.exitcode
    return 128 - code if code is not None and code < 0 else int(code or 0)


def _run_subprocess(argv: Sequence[str], cwd: Path, log: Path, environ: Mapping[str, str]) -> int:
    """``run_forked`` without a fork server: a new interpreter, its own process group."""
    with open(log, "wb") as stream:
        command = [sys.executable, "-m", "gpu_mem_track", *argv]
        with _lock:
            if _stopping[0]:
                raise Stopped("fit was interrupted")
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=dict(environ),
                stdout=stream,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            _live[process.pid] = process
        try:
            return process.wait()
        except BaseException:
            _end_group(process.pid, signal.SIGTERM)
            process.wait()
            raise
        finally:
            with _lock:
                _live.pop(process.pid, None)


def stop_all(grace: float = 5.0) -> None:
    """Refuse new trials, end every running trial's process group (SIGTERM, then SIGKILL
    after ``grace`` seconds for what is left) and stop the fork server. Safe to call
    from any thread, more than once."""
    with _lock:
        _stopping[0] = True
        pids = list(_live)
    for pid in pids:
        _end_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_group_alive(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if _group_alive(pid):
            _end_group(pid, signal.SIGKILL)
    close_server()


def resume() -> None:
    """Allow trials again after :func:`stop_all` (a later ``fit`` in the same process)."""
    with _lock:
        _stopping[0] = False


def _end_group(pid: int, signum: int) -> None:
    """Send ``signum`` to the trial's process group (to the trial alone while it has not
    made its group yet)."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(pid: int) -> bool:
    """Whether a process of the group ``pid`` leads (or ``pid`` itself) still runs (a
    zombie not yet reaped counts as ended)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_state(entry) not in ("Z", "") for entry in _group_members(pid))


def _group_members(pgid: int) -> list[str]:
    """The /proc entries of the processes in group ``pgid`` (Linux; elsewhere: [pgid])."""
    proc = Path("/proc")
    if not proc.is_dir():
        return [str(pgid)]
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry.name)
            if fields and int(fields[2]) == pgid:
                members.append(entry.name)
    return members


def _stat_fields(pid: str) -> list[str]:
    """``/proc/PID/stat`` after the command's name: state, ppid, pgrp, session, ...; []
    when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()


def _state(pid: str) -> str:
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def close_server() -> None:
    """Stop the fork server and wait for it to end (a later trial starts a new one). It
    would end once it saw fit's process end, a moment after: stopped now, it starts no
    trial asked for late, and a launcher that waits for fit alone (torchrun) cannot
    return while it still runs."""
    if not _context:
        return
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)
    if stop is not None:
        try:
            stop()
        except OSError:
            pass


def _child(argv: list[str], cwd: str, environ: dict[str, str], log: str) -> None:
    """In the forked process: its own process group, the trial's folder, environment and
    log, then the command."""
    os.setpgid(0, 0)
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
