"""Installs from source (``pip install .``, ``pip install -e .``) also build the native modules.

The package itself is declared in ``setup.cfg``. This file adds one step to a build from
source: compiling the native modules (``gpu_mem_track/native/build.py``: the census's reader,
the runner's line sink, and the CUDA statistics reader on a CUDA build of torch) against the
torch of the interpreter being installed into, so that ``MemTracker().track()`` and ``run``
take their fast paths from their first call. A module compiled at install time goes into the
same cache folder as one built on first use, keyed by torch, Python and source.

pip builds in an isolated environment that hides the user's packages; the step therefore runs
the same interpreter in a child process without pip's isolation (its folder on ``PYTHONPATH``
and ``PYTHONNOUSERSITE``; the user's own ``PYTHONPATH`` entries are kept), which sees the
user's torch. A front end that builds in a virtual environment of its own (``python -m
build``, uv) runs another interpreter, without the user's torch: the step is skipped there.
It is skipped, and the install goes on, when torch is not importable, no C++ compiler is
found or ``GPU_MEM_TRACK_NATIVE=off`` is set: the modules are then built on first use, in
the background. A compile that fails is recorded (``failed`` beside ``build.log``) and not
retried by itself; ``python -m gpu_mem_track.native.build`` tries again. A wheel installed
as a binary runs no build step at all (nothing of a package runs at install time then);
first use builds the modules too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_mem_track.switches import switched_off  # noqa: E402 (imports nothing else)

#: The prefix of pip's temporary build-environment folders (``pip-build-env-*``), whose
#: ``site`` folder pip puts on ``PYTHONPATH`` in place of the user's, with
#: ``PYTHONNOUSERSITE=1`` beside it.
PIP_BUILD_ENV = "pip-build-env-"
_done: list[bool] = []


def build_native() -> None:
    """Compile the native modules for the user's torch, once per build; never fails the install."""
    if _done or switched_off("GPU_MEM_TRACK_NATIVE"):
        return
    _done.append(True)
    env = child_environ(os.environ)
    command = [sys.executable, "-m", "gpu_mem_track.native.build"]
    try:
        # no timeout here: each compile has its own (native/build.py), and a child killed
        # from here would leave its compiler and its lock behind
        done = subprocess.run(command, env=env, cwd=HERE, check=False, capture_output=True, text=True)
    except OSError as error:
        print(f"gpu_mem_track: native modules not built at install ({error}); built on first use")
        return
    why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    if done.returncode == 0:
        for line in done.stdout.strip().splitlines():
            print(f"gpu_mem_track: {line}")
    elif done.returncode == 1:  # a compile failed: recorded, not retried by first use
        print(f"gpu_mem_track: {why}; python -m gpu_mem_track.native.build tries again")
    else:  # 2: no torch or compiler here (or the child's own error)
        print(f"gpu_mem_track: native modules not built at install ({why}); built on first use")


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for the build's child: without pip's isolation (its build environment's
    folder on ``PYTHONPATH`` and, with it, ``PYTHONNOUSERSITE``), the user's own
    ``PYTHONPATH`` entries kept, behind this source tree (whose ``gpu_mem_track`` builds,
    not an installed one)."""
    env = dict(environ)
    entries = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    kept = [entry for entry in entries if PIP_BUILD_ENV not in entry]
    if len(kept) < len(entries):  # pip's isolated build: it set PYTHONNOUSERSITE too
        env.pop("PYTHONNOUSERSITE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *kept])
    return env


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        build_native()


if __name__ == "__main__":  # as setuptools runs it; a test imports it under another name
    setup(cmdclass={"build_py": BuildPy})
