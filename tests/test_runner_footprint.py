"""What the runner leaves in the script's process: its objects out of the script's garbage
collections (``launch.runner_objects_frozen``), and the file names of the script's code
resolved as ``os.path.realpath`` does (``run._real_paths``, which decides what is traced)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

from gpu_mem_track.runner.launch import runner_objects_frozen
from gpu_mem_track.runner.run import _real_paths

ROOT = Path(__file__).resolve().parents[1]


def seen_by_gc(thing: object) -> bool:
    return any(o is thing for o in gc.get_objects())


def test_objects_alive_before_are_frozen_in_the_block_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    before = []  # a list: tracked by the collector
    with runner_objects_frozen() as froze:
        during = []
        assert froze
        assert not seen_by_gc(before)
        assert seen_by_gc(during)
    assert seen_by_gc(before)
    assert gc.get_freeze_count() == 0


def test_nothing_is_frozen_once_torch_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    count = gc.get_freeze_count()
    before = []
    with runner_objects_frozen() as froze:
        assert not froze
        assert gc.get_freeze_count() == count
        assert seen_by_gc(before)


def test_the_script_does_not_see_the_runners_objects(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc, sys
            runner = sys.modules["gpu_mem_track.runner.run"]
            mine = []
            print("runner", any(o is runner.execute for o in gc.get_objects()))
            print("mine", any(o is mine for o in gc.get_objects()))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), GPU_MEM_TRACK_NATIVE="off")
    command = ["run", "--device", "cpu", "--out-dir", str(tmp_path), str(script)]
    out = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "runner False" in out.stdout.splitlines()
    assert "mine True" in out.stdout.splitlines()


def test_real_paths_are_what_realpath_gives(tmp_path, monkeypatch):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "a.py").write_text("")
    (tmp_path / "link").symlink_to(real)
    (real / "b.py").symlink_to(real / "sub" / "a.py")  # a file linked elsewhere
    (real / "c.py").symlink_to(Path("sub") / "a.py")  # relative link
    (real / "loop.py").symlink_to(real / "loop.py")
    monkeypatch.chdir(real)
    names = [
        f"{tmp_path}/link/sub/a.py",
        f"{tmp_path}/link/b.py",
        f"{tmp_path}/link/c.py",
        f"{tmp_path}/link/../real/b.py",
        f"{tmp_path}//link//sub/a.py",
        f"{tmp_path}/link/sub/..",
        f"{tmp_path}/link/loop.py",
        f"{tmp_path}/missing/x.py",
        "sub/a.py",
        "b.py",
        sys.executable,
    ]
    real_path = _real_paths()
    for _ in range(2):  # the folders' cache
        assert [real_path(name) for name in names] == [os.path.realpath(name) for name in names]
