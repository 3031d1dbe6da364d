"""advisor/forked.py: trials forked from a server that imported torch once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_mem_track.advisor.forked import run_forked

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("server", ["on", "off"])
def test_a_command_runs_in_the_folder_given_with_its_output_in_the_log(tmp_path, monkeypatch, server):
    monkeypatch.setenv("GPU_MEM_TRACK_FORKSERVER", server)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    script = tmp_path / "where.py"
    script.write_text("import os\nprint('cwd', os.getcwd())\nprint('var', os.environ.get('TRIAL_VAR'))\n")
    monkeypatch.setenv("TRIAL_VAR", "given")
    log = tmp_path / "trial.log"
    argv = ["run", "--device", "cpu", "--out-dir", str(tmp_path / "runs"), "where.py"]
    code = run_forked(argv, tmp_path, log)
    text = log.read_text()
    assert code == 0, text
    assert f"cwd {tmp_path}" in text and "var given" in text
    assert (tmp_path / "runs").is_dir()


def test_the_exit_code_is_the_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    log = tmp_path / "trial.log"
    assert run_forked(["run", "--simulate", "no-such-gpu", "x.py"], tmp_path, log) == 2
    assert log.read_text().startswith("gpu_mem_track: no such script: x.py")
    (tmp_path / "fails.py").write_text("raise SystemExit(7)\n")
    assert run_forked(["run", "--device", "cpu", "--out-dir", str(tmp_path), "fails.py"], tmp_path, log) == 7


def test_a_caller_without_a_main_guard_is_not_run_again(tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(
        "from pathlib import Path\n"
        "from gpu_mem_track.advisor.forked import run_forked\n"
        "print('CALLER RAN', flush=True)\n"
        f"code = run_forked(['gpus'], Path({str(tmp_path)!r}), Path({str(tmp_path / 'g.log')!r}))\n"
        "print('CODE', code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_MEM_TRACK_FORKSERVER": "on"}
    done = subprocess.run([sys.executable, str(caller)], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.count("CALLER RAN") == 1, done.stdout + done.stderr
    assert "CODE 0" in done.stdout
    assert "RTX-4090" in (tmp_path / "g.log").read_text()


def test_the_script_imports_of_installed_packages_are_listed_and_made(tmp_path, monkeypatch):
    """The fork server's preload of the script's imports: installed packages only (not the
    script's own modules), and made by ``make_imports`` from the environment."""
    import json

    from gpu_mem_track.advisor import preload

    (tmp_path / "mine.py").write_text("raise SystemExit('a local module is not preloaded')\n")
    (tmp_path / "train.py").write_text(
        "import json\nimport pytest\nimport mine\nfrom mine import x\nfrom _pytest import python as p\n"
        "from . import rel\n\ndef f():\n    import numpy\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = preload.script_imports(tmp_path / "train.py")
    assert found == [("pytest", ()), ("_pytest", ("python",))]  # json: stdlib; mine: local
    monkeypatch.setenv(preload.ENV, json.dumps([["colorsys", ["rgb_to_hls"]], ["no_such_pkg", []]]))
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    preload.make_imports()  # the missing package is ignored
    assert "colorsys" in sys.modules
