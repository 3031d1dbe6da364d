"""``python -m gpu_mem_track run`` end to end, in subprocesses, on scripts in tmp_path."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_mem_track.runfolder.files import read_lines, read_meta, read_timeline

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def sigint_default() -> None:
    """In the child: SIGINT at its default, as in a terminal. Started in the background of
    a non-interactive shell (``&``, nohup) the tests inherit SIGINT ignored, and Python
    keeps an ignored SIGINT ignored: no KeyboardInterrupt would ever come."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(tmp_path: Path, *args: str, name: str = "r", timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--out-dir", str(tmp_path / "reports")]
    command += ["--run-name", name, "--device", "cpu", *args]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=timeout,
        preexec_fn=sigint_default if os.name == "posix" else None,
    )


def folder(tmp_path: Path, name: str = "r") -> Path:
    return tmp_path / "reports" / name


def test_script_runs_as_main_with_its_argv_and_path(tmp_path):
    write(tmp_path / "helper_mod.py", "VALUE = 41\n")
    (tmp_path / "sub").mkdir()
    script = write(
        tmp_path / "sub" / "main.py",
        """
        import sys
        sys.path.insert(1, sys.argv[1])
        import helper_mod
        print(__name__, sys.argv[1:], sys.path[0].endswith("sub"), helper_mod.VALUE + 1)
        """,
    )
    done = run(tmp_path, str(script), str(tmp_path), "--flag")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"__main__ [{str(tmp_path)!r}, '--flag'] True 42"
    out = folder(tmp_path)
    assert {p.name for p in out.iterdir()} >= {"meta.json", "lines.csv", "timeline.csv", "report.txt"}
    meta = read_meta(out / "meta.json")
    assert (meta.exit_code, meta.memory_source, meta.device) == (0, "process RSS", "cpu")
    assert meta.argv[1:] == (str(tmp_path), "--flag")
    lines = read_lines(out / "lines.csv")
    assert {r.line for r in lines} == {2, 3, 4, 5}
    assert all(r.hits == 1 for r in lines)
    assert "Reports:" in done.stderr and "exited with 0" in done.stderr


@pytest.mark.parametrize(
    ("body", "code", "stderr_has"),
    [
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('bad input')", 1, "bad input"),
        ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGINT)", 130, "KeyboardInterrupt"),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
            143,
            "SIGTERM received, writing the reports",
        ),
    ],
)
def test_exit_codes_and_reports_after_failures(tmp_path, body, code, stderr_has):
    script = write(tmp_path / "fail.py", f"data = [0] * 1000\ndef go():\n    {body}\ngo()\n")
    done = run(tmp_path, str(script))
    assert done.returncode == code, done.stderr
    assert stderr_has in done.stderr
    out = folder(tmp_path)
    assert read_meta(out / "meta.json").exit_code == code
    assert {r.line for r in read_lines(out / "lines.csv")} >= {1, 2, 3, 4}
    events = [row.event for row in read_timeline(out / "timeline.csv")]
    assert events[0] == "start" and events[-1] == "end" and "line" in events
    assert (out / "report.txt").read_text().startswith("gpu_mem_track run r:")


def test_an_exception_shows_the_scripts_traceback_not_ours(tmp_path):
    script = write(tmp_path / "tb.py", "def inner():\n    return 1 / 0\ninner()\n")
    done = run(tmp_path, str(script))
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):\n")
    assert 'tb.py", line 3, in <module>' in done.stderr and "ZeroDivisionError" in done.stderr
    assert "runner.py" not in done.stderr and "runpy" not in done.stderr


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: str(tmp / "missing.py"), "no such script"),
        (lambda tmp: str(tmp), "is a folder"),
    ],
)
def test_bad_script_is_one_line_and_exit_2(tmp_path, make, message):
    done = run(tmp_path, make(tmp_path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "reports" / "r").exists()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_script_is_exit_2(tmp_path):
    script = write(tmp_path / "secret.py", "print(1)\n")
    script.chmod(0)
    done = run(tmp_path, str(script))
    assert done.returncode == 2 and "cannot read" in done.stderr


def test_unwritable_output_folder_is_exit_2_before_the_script_runs(tmp_path):
    script = write(tmp_path / "ok.py", "open('ran', 'w').close()\n")
    blocker = tmp_path / "reports"
    blocker.write_text("a file where the folder should be")
    done = run(tmp_path, str(script))
    assert done.returncode == 2
    assert done.stderr.startswith("gpu_mem_track: cannot write reports to") and done.stderr.count("\n") == 1
    assert not (tmp_path / "ran").exists()


@pytest.mark.slow
def test_include_adds_a_module_and_nothing_else_is_traced(tmp_path):
    write(tmp_path / "mylib.py", "def make():\n    return [0] * 10\n")
    script = write(tmp_path / "main.py", "import json\nimport mylib\nmylib.make()\njson.dumps([1])\n")
    done = run(tmp_path, str(script), name="plain")
    assert done.returncode == 0, done.stderr
    files = {Path(r.file).name for r in read_lines(folder(tmp_path, "plain") / "lines.csv")}
    assert files == {"main.py"}
    for include in ("mylib", str(tmp_path / "mylib.py"), str(tmp_path)):
        done = run(tmp_path, "--include", include, str(script), name="inc")
        assert done.returncode == 0, done.stderr
        records = read_lines(folder(tmp_path, "inc") / "lines.csv")
        assert {Path(r.file).name for r in records} == {"main.py", "mylib.py"}, include
        assert ("make", 2) in {(r.function, r.line) for r in records}
        for path in folder(tmp_path, "inc").parent.glob("inc*"):
            for child in path.iterdir():
                child.unlink()
            path.rmdir()


def test_include_of_something_unknown_is_exit_2(tmp_path):
    script = write(tmp_path / "main.py", "pass\n")
    done = run(tmp_path, "--include", "no_such_module_xyz", str(script))
    assert done.returncode == 2 and "no_such_module_xyz" in done.stderr


def test_bad_census_threshold_is_exit_2(tmp_path):
    script = write(tmp_path / "main.py", "pass\n")
    done = run(tmp_path, "--census-threshold", "lots", str(script))
    assert done.returncode == 2 and "not a byte size" in done.stderr


@pytest.mark.slow  # in process: test_stamp_listeners.py
def test_torch_and_tracker_stamps_land_in_the_run(tmp_path):
    script = write(
        tmp_path / "train.py",
        """
        import torch
        from gpu_mem_track import MemTracker

        tracker = MemTracker(verbosity=0, probe=False)
        tracker.track("start")
        big = torch.ones(2048, 4096)
        tracker.watch(big=big)
        tracker.track("after big")
        """,
    )
    done = run(tmp_path, "--census-threshold", "16MiB", str(script))
    assert done.returncode == 0, done.stderr
    out = folder(tmp_path)
    assert not (tmp_path / "reports" / "tracker.csv").exists()
    with (out / "tracker.csv").open() as handle:
        labels = [row["label"] for row in csv.DictReader(handle) if row["row"] == "totals"]
    assert labels == ["start", "after big"]
    timeline = list(read_timeline(out / "timeline.csv"))
    assert [row.label for row in timeline if row.event == "track"] == ["start", "after big"]
    censuses = [row for row in timeline if row.event == "census"]
    assert 7 in [row.line for row in censuses]  # (line 2, import torch, may grow RSS past it too)
    report = (out / "report.txt").read_text()
    assert "Automatic censuses" in report and "Size:(2048, 4096)" in report
    big_line = next(r for r in read_lines(out / "lines.csv") if r.line == 7)
    assert big_line.increment >= 32 * 2**20 - 2**20  # RSS grows by about the tensor's 32 MiB
    assert big_line.peak >= big_line.memory
    meta = json.loads((out / "meta.json").read_text())
    assert meta["peak"] >= big_line.peak and meta["torch"]


def test_cli_help_describes_every_option():
    done = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", "run", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0
    for option in (
        "--include",
        "--out-dir",
        "--run-name",
        "--device",
        "--census-threshold",
        "--engine",
        "--top",
        "--activations",
        "--snapshot",
        "--snapshot-entries",
    ):
        assert option in done.stdout
    assert signal.SIGINT  # the Ctrl-C case above relies on SIGINT


@pytest.mark.slow
def test_activations_flag_names_saved_tensors_in_the_census(tmp_path):
    script = write(
        tmp_path / "act.py",
        """
        import torch

        x = torch.randn(1024, 4096, requires_grad=True)
        loss = (x * 2).relu().sum()
        loss.backward()
        """,
    )
    done = run(tmp_path, "--activations", "--census-threshold", "8MiB", str(script))
    assert done.returncode == 0, done.stderr
    report = (folder(tmp_path) / "report.txt").read_text()
    assert "| Activation | float32 | saved at act.py:5" in report
    census = (folder(tmp_path) / "census.csv").read_text()
    assert "cat_activation" in census.splitlines()[0]


@pytest.mark.slow
def test_run_needs_no_torch_on_the_cpu(tmp_path):
    """``run --device cpu`` imports nothing of torch itself (checked on a Python without it)."""
    from engine_workload import python312

    interpreter = python312()
    if interpreter is None:
        pytest.skip("no Python 3.12+ here")
    script = write(tmp_path / "plain.py", "import sys\nprint('torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [interpreter, "-m", "gpu_mem_track", "run", "--device", "cpu", "--out-dir", str(tmp_path)]
    done = subprocess.run([*command, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False\n"
    assert read_meta(next(tmp_path.glob("plain-*")) / "meta.json").engine == "sys.monitoring"


def test_engine_this_python_lacks_is_exit_2_before_anything_runs(tmp_path):
    if sys.version_info >= (3, 12):
        pytest.skip("this Python has sys.monitoring")
    script = write(tmp_path / "main.py", "open('ran', 'w').close()\n")
    done = run(tmp_path, "--engine", "monitoring", str(script))
    assert done.returncode == 2 and "sys.monitoring needs Python 3.12+" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ran").exists() and not folder(tmp_path).exists()


def test_negative_top_is_a_usage_error(tmp_path):
    script = write(tmp_path / "main.py", "pass\n")
    done = run(tmp_path, "--top", "-1", str(script))
    assert done.returncode == 2 and "not a count" in done.stderr
