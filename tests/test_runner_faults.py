"""``run`` under faults: our errors never enter the user's script and never change its exit
code (a full reports disk, a removed working folder, closed standard streams), and Ctrl-C
prints what python prints."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import pytest
from test_runner import ROOT, folder, write

from gpu_mem_track.runfolder.files import read_lines, read_meta, read_timeline

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX resource limits and signals")


def run_limited(tmp_path, script, file_limit: int | None = None):
    """``run`` with every file it writes limited to ``file_limit`` bytes (``EFBIG``, as a
    full disk gives ``ENOSPC``: ``OSError`` on a write)."""

    def limit() -> None:
        # SIGINT at its default, as in a terminal: in the background of a non-interactive
        # shell (`&`, nohup) it is inherited ignored, and Python keeps it ignored.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if file_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    command = [sys.executable, "-m", "gpu_mem_track", "run", "--out-dir", str(tmp_path / "reports")]
    command += ["--run-name", "r", "--device", "cpu", str(script)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, preexec_fn=limit
    )


LOOP = """
import sys
total = 0
try:
    for i in range(20000):
        total += i
except OSError as exc:
    print("the script caught", exc)
    sys.exit(3)
sys.exit(5)
"""


def test_a_full_reports_disk_while_the_script_runs_leaves_the_script_alone(tmp_path):
    script = write(tmp_path / "loop.py", LOOP)
    done = run_limited(tmp_path, script, file_limit=64 * 1024)  # timeline.csv outgrows it
    assert done.returncode == 5, done.stderr
    assert "the script caught" not in done.stdout and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gpu_mem_track: could not write timeline.csv: File too large")
    assert "lines.csv" not in last  # the small files were written
    (reports,) = [line for line in done.stderr.splitlines() if line.startswith("Reports: ")]
    assert reports.endswith("(report.txt, lines.csv)")  # timeline.csv is named as not written
    notes: list[str] = []
    rows = list(read_timeline(folder(tmp_path) / "timeline.csv", notes))
    assert rows and rows[0].event == "start"  # what was written reads back
    assert read_meta(folder(tmp_path) / "meta.json").exit_code == 5
    assert {r.line for r in read_lines(folder(tmp_path) / "lines.csv")} >= {5, 6}


def test_reports_that_cannot_be_written_before_the_script_starts_stop_it_with_one_line(tmp_path):
    script = write(tmp_path / "loop.py", LOOP)
    done = run_limited(tmp_path, script, file_limit=0)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("gpu_mem_track: cannot write reports to ")
    assert done.stderr.rstrip().endswith("File too large")
    assert not (tmp_path / "reports" / "r").exists()  # nothing written half


def test_a_script_that_removes_its_working_folder_keeps_its_exit_code(tmp_path):
    script = write(
        tmp_path / "gone.py",
        """
        import os, shutil, tempfile
        away = tempfile.mkdtemp()
        os.chdir(away)
        shutil.rmtree(away)
        print("bye")
        """,
    )
    done = run_limited(tmp_path, script)
    assert (done.returncode, done.stdout) == (0, "bye\n"), done.stderr
    assert "Traceback" not in done.stderr
    assert read_meta(folder(tmp_path) / "meta.json").exit_code == 0


def test_a_script_that_closes_stdout_and_stderr_keeps_its_exit_code(tmp_path):
    source = "import os\nprint('before', flush=True)\nos.close(1)\nos.close(2)\n"
    script = write(tmp_path / "closed.py", source)
    done = run_limited(tmp_path, script)
    assert (done.returncode, done.stdout, done.stderr) == (0, "before\n", "")
    assert read_meta(folder(tmp_path) / "meta.json").exit_code == 0


def test_ctrl_c_prints_the_traceback_python_prints(tmp_path):
    script = write(
        tmp_path / "interrupted.py",
        """
        import os, signal


        def wait():
            os.kill(os.getpid(), signal.SIGINT)
            while True:
                pass


        wait()
        """,
    )
    plain = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as run_limited does
    )
    done = run_limited(tmp_path, script)
    assert done.returncode == 130
    assert plain.stderr.startswith("Traceback (most recent call last):")
    traceback = done.stderr[: done.stderr.index("gpu_mem_track:")]
    assert traceback.startswith("Traceback (most recent call last):")
    assert traceback.splitlines()[-1] == "KeyboardInterrupt"
    assert 'interrupted.py", line 11, in <module>' in traceback and ", in wait" in traceback
    assert "gpu_mem_track" not in traceback  # none of our frames


def test_ctrl_c_before_the_script_starts_leaves_no_empty_run_folder(tmp_path, monkeypatch):
    """Ctrl-C in the second the runner imports torch (before meta.json) left an empty run
    folder, which show and compare then refused as 'not a gpu_mem_track run folder'."""
    from gpu_mem_track.runner import run as runner
    from gpu_mem_track.runner.options import RunOptions

    def interrupted(path):
        raise KeyboardInterrupt

    script = write(tmp_path / "loop.py", LOOP)
    prepared = runner.prepare(RunOptions(script=str(script), out_dir=str(tmp_path / "reports"), device="cpu"))
    assert prepared.folder.path.is_dir()  # claimed by prepare
    monkeypatch.setattr(runner, "TimelineWriter", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.execute(prepared)
    assert list((tmp_path / "reports").iterdir()) == []


def test_sigterm_before_the_script_starts_leaves_no_empty_run_folder_and_exits_143(tmp_path):
    """SIGTERM in the set-up killed the runner at once, leaving its run folder empty; it
    now unwinds, removes the folder and dies of the signal as before (143)."""
    script = write(tmp_path / "loop.py", LOOP)
    code = (
        "import os, signal, sys\n"
        "from gpu_mem_track.runner import run as runner\n"
        "from gpu_mem_track.runner.options import RunOptions\n"
        "class Killed:\n"
        "    def __init__(self, path):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"  # as a SIGTERM in torch's import would
        f"prepared = runner.prepare(RunOptions(script={str(script)!r}, out_dir='reports', device='cpu'))\n"
        "runner.TimelineWriter = Killed\n"
        "runner.execute(prepared)\n"
        "print('not reached')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert list((tmp_path / "reports").iterdir()) == []
