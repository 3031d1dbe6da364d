"""An install from source builds the native modules (``setup.py``): pip builds in an isolated
environment without the user's torch, and the step must still find this interpreter's torch."""

from __future__ import annotations

import os
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
    done = _wheel(tmp_path, GPU_MEM_TRACK_CACHE=str(tmp_path / "cache"), GPU_MEM_TRACK_NATIVE="off")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "cache").exists()
