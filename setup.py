"""Installs from source (``pip install .``, ``pip install -e .``) also build the native modules.

The package itself is declared in ``setup.cfg``. This file adds one step to a build from
source: compiling the native modules (``gpu_mem_track/native/build.py``: the census's reader,
the runner's line sink, and the CUDA statistics reader on a CUDA build of torch) against the
torch of the interpreter being installed into, so that ``MemTracker().track()`` and ``run``
take their fast paths from their first call. A module compiled at install time goes into the
same cache folder as one built on first use, keyed by torch, Python and source.

pip builds in an isolated environment that hides the user's packages; the step therefore runs
the same interpreter in a child process with pip's isolation variables removed, which sees the
user's torch. It is skipped, and the install goes on, when torch is not importable there, no
C++ compiler is found, ``GPU_MEM_TRACK_NATIVE=off`` is set, or a compile fails: the modules are
then built on first use, in the background. A wheel installed as a binary runs no build step
at all (nothing of a package runs at install time then); first use builds the modules too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_mem_track.switches import switched_off  # noqa: E402 (imports nothing else)

#: Variables pip sets to isolate a build from the user's site-packages.
ISOLATION = ("PYTHONPATH", "PYTHONNOUSERSITE")
#: Every module's compile together (the census's takes 15-30 s on two cores).
TIMEOUT_SECONDS = 600
_done: list[bool] = []


def build_native() -> None:
    """Compile the native modules for the user's torch, once per build; never fails the install."""
    if _done or switched_off("GPU_MEM_TRACK_NATIVE"):
        return
    _done.append(True)
    env = {key: value for key, value in os.environ.items() if key not in ISOLATION}
    env["PYTHONPATH"] = str(HERE)  # this source tree's gpu_mem_track, not an installed one
    command = [sys.executable, "-m", "gpu_mem_track.native.build", "--quiet"]
    try:
        done = subprocess.run(
            command, env=env, cwd=HERE, timeout=TIMEOUT_SECONDS, check=False, capture_output=True, text=True
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"gpu_mem_track: native modules not built at install ({error}); built on first use")
        return
    if done.returncode != 0:  # 2: no torch or compiler here; 1: a compile failed (see build.log)
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        print(f"gpu_mem_track: native modules not built at install ({why}); built on first use")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        build_native()


class EditableWheel(editable_wheel):
    def run(self) -> None:
        super().run()
        build_native()


setup(cmdclass={"build_py": BuildPy, "editable_wheel": EditableWheel})
