"""An install from source builds the native modules (``setup.py``): pip builds in an isolated
environment without the user's torch, and the step must still find this interpreter's torch."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_mem_track.native import build

ROOT = Path(__file__).resolve().parents[1]


def _wheel(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    wheels = str(tmp_path / "wheels")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, str(ROOT)]
    return subprocess.run(
        command, env={**os.environ, **env}, capture_output=True, text=True, timeout=900, check=False
    )


@pytest.mark.slow
def test_building_the_wheel_compiles_the_native_modules_for_this_torch(tmp_path):
    target = build.plan(tmp_path / "cache")
    if target.missing:
        pytest.skip(f"no native build here: {target.missing}")
    done = _wheel(tmp_path, GPU_MEM_TRACK_CACHE=str(tmp_path / "cache"), GPU_MEM_TRACK_NATIVE="auto")
    assert done.returncode == 0, done.stderr[-2000:]
    assert build.plan(tmp_path / "cache").built  # the census's reader, where first use looks
    assert build.plan(tmp_path / "cache", name=build.LINE_MODULE).built
    assert list((tmp_path / "wheels").glob("gpu_mem_track-*.whl"))


@pytest.mark.slow
def test_the_native_switch_turns_the_install_step_off(tmp_path):
    target = build.plan(tmp_path / "cache")
    if target.missing:  # nothing would be built anyway: the switch would show nothing
        pytest.skip(f"no native build here: {target.missing}")
    done = _wheel(tmp_path, GPU_MEM_TRACK_CACHE=str(tmp_path / "cache"), GPU_MEM_TRACK_NATIVE="off")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "cache").exists()


def test_the_build_child_drops_pips_isolation_and_keeps_the_users_pythonpath(tmp_path):
    """pip's isolated build puts its build environment's ``site`` folder on PYTHONPATH with
    PYTHONNOUSERSITE=1; without isolation (``--no-build-isolation``) PYTHONPATH is the
    user's own (a torch found through it, as an HPC module sets it) and must stay."""
    setup = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")  # runs no setup()
    child_environ = setup["child_environ"]
    pip_site = str(tmp_path / "pip-build-env-abc123" / "site")
    isolated = child_environ({"PYTHONPATH": pip_site, "PYTHONNOUSERSITE": "1", "HOME": "/h"})
    assert isolated == {"PYTHONPATH": str(ROOT), "HOME": "/h"}
    users = os.pathsep.join(["/opt/torch/site", "/home/me/lib"])
    plain = child_environ({"PYTHONPATH": users, "PYTHONNOUSERSITE": "1"})
    assert plain["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/opt/torch/site", "/home/me/lib"]
    assert plain["PYTHONNOUSERSITE"] == "1"  # the user's own choice, pip did not set it
    assert child_environ({})["PYTHONPATH"] == str(ROOT)


def test_without_torch_the_build_command_exits_2_in_one_line(monkeypatch, capsys):
    """pip builds a package before it installs its requirements: an install from source
    into an environment without torch yet meets no torch, which is 'cannot be tried here'
    (setup.py: built on first use), not a failed compile."""
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert build.main([]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("cannot build the native reader: torch is not importable here")
        and err.count("\n") == 1
    )
