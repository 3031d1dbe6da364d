"""``run`` end to end: nothing lost however the script ends or moves, the script's command
line as Python gives it, and options that say what they do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from test_runner import ROOT, folder, run, write

from gpu_mem_track.runfolder.files import read_lines, read_meta, read_timeline
from gpu_mem_track.runs.load import load_run


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_mem_track", "run", "--device", "cpu", "--run-name", "r", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_a_script_that_changes_folder_still_gets_its_reports(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    write(
        tmp_path / "mover.py",
        """
        import os
        os.chdir("elsewhere")
        from gpu_mem_track import MemTracker
        MemTracker(verbosity=0).track("moved")
        data = [0] * 1000
        """,
    )
    # relative --out-dir, resolved in the folder the run started in
    done = subprocess.run(
        command("--out-dir", "reports", "mover.py"), capture_output=True, text=True, cwd=tmp_path, env=env()
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "reports" / "r"
    assert read_meta(out / "meta.json").exit_code == 0
    assert {r.line for r in read_lines(out / "lines.csv")} >= {2, 3, 6}
    assert (out / "report.txt").is_file() and (out / "tracker.csv").is_file()
    assert not (tmp_path / "elsewhere" / "reports").exists()
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGTERM, getattr(signal, "SIGHUP", 1)])
def test_sigterm_and_sighup_write_the_reports_and_exit_128_plus_the_signal(tmp_path, signum):
    write(
        tmp_path / "serve.py",
        """
        import sys, time
        data = [0] * 1000
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
        """,
    )
    process = subprocess.Popen(
        command("--out-dir", "reports", "serve.py"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env(),
        # at its default, as in a terminal: under nohup (a CI job started with it) SIGHUP
        # is ignored, and the runner rightly keeps an ignored signal ignored
        preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL),
    )
    try:
        assert process.stdout.readline() == "ready\n"
        time.sleep(0.2)  # into the loop
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signum, stderr
    assert f"{signal.Signals(signum).name} received" in stderr
    out = tmp_path / "reports" / "r"
    meta = read_meta(out / "meta.json")
    assert meta.exit_code == 128 + signum and meta.ended is not None
    assert {r.line for r in read_lines(out / "lines.csv")} >= {2, 3, 4, 5, 6}
    assert [row.event for row in read_timeline(out / "timeline.csv")][-1] == "end"
    assert (out / "report.txt").read_text().startswith("gpu_mem_track run r:")


@pytest.mark.slow
def test_script_sees_the_command_line_python_would_give_it(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "argv.py", "import sys\nprint(sys.argv)\n")
    script_args = ["--", "--out-dir", "x", "--top", "3", "-v"]
    plain = subprocess.run(
        [sys.executable, "sub/argv.py", *script_args], capture_output=True, text=True, cwd=tmp_path
    )
    done = subprocess.run(
        command("--out-dir", "reports", "sub/argv.py", *script_args),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout == f"{['sub/argv.py', *script_args]}\n"
    assert read_meta(tmp_path / "reports" / "r" / "meta.json").argv == ("sub/argv.py", *script_args)
    # options after the script are the script's; `--` before the script ends ours
    done = subprocess.run(
        command("--out-dir", "reports", "--run-name", "r2", "--", "sub/argv.py", "--out-dir", "y"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env(),
    )
    assert done.stdout == "['sub/argv.py', '--out-dir', 'y']\n", done.stderr
    assert (tmp_path / "reports" / "r2").is_dir() and not (tmp_path / "y").exists()


@pytest.mark.parametrize("name", ["torch", "json", "os", "gpu_mem_track"])
def test_include_of_torch_or_the_standard_library_is_refused(tmp_path, name):
    script = write(tmp_path / "main.py", "open('ran', 'w').close()\n")
    done = run(tmp_path, "--include", name, str(script))
    assert done.returncode == 2
    assert done.stderr == (
        f"gpu_mem_track: --include {name}: torch, the standard library and gpu_mem_track are never traced\n"
    )
    assert not (tmp_path / "ran").exists()


@pytest.mark.slow
def test_out_dir_that_is_a_file_says_so(tmp_path):
    script = write(tmp_path / "ok.py", "x = 1\n")
    done = run(tmp_path, "--out-dir", str(script), str(script))
    assert done.returncode == 2
    assert done.stderr == f"gpu_mem_track: cannot write reports to {script}: it is a file, not a folder\n"
    done = run(tmp_path, "--out-dir", f"{script}/deeper", str(script))
    assert done.returncode == 2 and f"({script} is a file)" in done.stderr


@pytest.mark.slow
def test_top_0_prints_every_line_that_raised_memory(tmp_path):
    body = "".join(f"x{i} = b'y' * ({i + 1} * 2**20)\n" for i in range(8))
    script = write(tmp_path / "many.py", body)
    everything = run(tmp_path, "--top", "0", str(script))
    assert everything.returncode == 0, everything.stderr
    listed = [line for line in everything.stderr.splitlines() if line.startswith("  ")]
    assert len(listed) == 8
    few = run(tmp_path, "--top", "2", str(script), name="r2")
    assert len([line for line in few.stderr.splitlines() if line.startswith("  ")]) == 2


def test_a_script_that_never_runs_a_line_has_one_peak_everywhere(tmp_path):
    script = write(tmp_path / "broken.py", "x = (\n")
    done = run(tmp_path, str(script))
    assert done.returncode == 1 and "SyntaxError" in done.stderr
    out = folder(tmp_path)
    meta = read_meta(out / "meta.json")
    rows = list(read_timeline(out / "timeline.csv"))
    highest = max(max(row.memory or 0, row.peak or 0) for row in rows)
    assert meta.peak == highest > 0 and meta.peak_at == ""
    assert load_run(out).peak == meta.peak
    assert "peak 0 B" not in (out / "report.txt").read_text()


def test_cpu_reports_say_what_their_figures_mean(tmp_path):
    script = write(tmp_path / "cpu.py", "x = b'y' * 2**20\n")
    done = run(tmp_path, str(script))
    assert "Note: CPU figures are RSS movements, not tensor bytes" in done.stderr
    report = (folder(tmp_path) / "report.txt").read_text()
    assert "Freed tensors go back to the C allocator" in report and "--memory heap" in report


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallinfo2")
def test_memory_heap_sees_freed_memory_where_rss_may_not(tmp_path):
    script = write(
        tmp_path / "heap.py",
        """
        big = b"x" * (40 * 2**20)
        del big
        again = b"y" * (40 * 2**20)
        """,
    )
    done = run(tmp_path, "--memory", "heap", str(script))
    assert done.returncode == 0, done.stderr
    assert "memory: C heap in use" in done.stderr
    lines = {r.line: r for r in read_lines(folder(tmp_path) / "lines.csv")}
    mib = 2**20
    assert abs(lines[2].increment - 40 * mib) < mib and abs(lines[3].increment + 40 * mib) < mib
    assert abs(lines[4].rise - 40 * mib) < mib and not lines[4].peak_exact  # no high-water mark
    assert read_meta(folder(tmp_path) / "meta.json").memory_source == "C heap in use"


def test_memory_choice_that_cannot_be_measured_is_exit_2(tmp_path):
    script = write(tmp_path / "ok.py", "x = 1\n")
    done = run(tmp_path, "--memory", "bogus", str(script))
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_dies_of_sigterm_as_without_the_runner(tmp_path):
    script = write(
        tmp_path / "forks.py",
        """
        import os, signal, time
        child = os.fork()
        if child == 0:
            while True:
                time.sleep(0.05)
        time.sleep(0.3)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        print("child killed by", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
        """,
    )
    done = run(tmp_path, str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"child killed by {int(signal.SIGTERM)}\n"
    assert "SIGTERM received" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "head", "rest"),
    [
        (["run", "t.py", "--", "-x"], ["run", "t.py"], ["--", "-x"]),
        (
            ["run", "--out", "o", "--top=3", "t.py", "--top", "1"],
            ["run", "--out", "o", "--top=3", "t.py"],
            ["--top", "1"],
        ),
        (
            ["run", "--activations", "--include", "m", "t.py"],
            ["run", "--activations", "--include", "m", "t.py"],
            [],
        ),
        (["run", "--", "-t.py", "a"], ["run", "--", "-t.py"], ["a"]),
        (["run", "--top", "3"], ["run", "--top", "3"], None),
        (["compare", "a", "b"], ["compare", "a", "b"], None),
        # fit: the GPU, then the script
        (
            ["fit", "--jobs", "2", "H100", "t.py", "--", "--lr", "-1"],
            ["fit", "--jobs", "2", "H100", "t.py"],
            ["--", "--lr", "-1"],
        ),
        (["fit", "H100", "t.py", "--json=3"], ["fit", "H100", "t.py"], ["--json=3"]),
        (["fit", "--", "-g", "-t.py"], ["fit", "--", "-g", "-t.py"], []),
        (["fit", "H100"], ["fit", "H100"], None),
    ],
)
def test_run_options_end_at_the_script_name(argv, head, rest):
    from gpu_mem_track.cli import build_parser
    from gpu_mem_track.commands.cmdline import split_script_argv

    assert split_script_argv(build_parser(), argv) == (head, rest)
