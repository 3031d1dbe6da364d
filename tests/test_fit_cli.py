"""``gpu-mem-track fit`` on the command line: a user's mistake is one line and exit 2,
before any trial runs."""

from __future__ import annotations

import subprocess
import sys

import pytest


def fit_cli(*argv: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", "fit", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("H900", "train.py"), "gpu_mem_track: unknown GPU 'H900': choose one of"),
        (("2GiB:sm80", "missing.py"), "gpu_mem_track: no such script: missing.py"),
        (
            ("--levers=bf16", "2GiB:sm80", "train.py"),
            "gpu_mem_track: unknown lever 'bf16'; the levers are: expandable,",
        ),
        (
            ("--html=nowhere/fit.html", "2GiB:sm80", "train.py"),
            "gpu_mem_track: --html nowhere/fit.html: no such folder",
        ),
        (
            ("--batch-arg=--batch_size", "2GiB:sm80", "train.py", "--lr=1"),
            "gpu_mem_track: --batch-arg --batch_size: the script's arguments do not hold it",
        ),
        (
            ("--batch-arg=--bs", "2GiB:sm80", "train.py", "--bs", "-4"),
            "gpu_mem_track: --batch-arg --bs: its value '-4' is not a positive integer",
        ),
        # what each trial's run would refuse is refused before the first trial
        (
            ("--max-seconds=0", "2GiB:sm80", "train.py"),
            "gpu_mem_track: --max-seconds must be above 0, not 0.0",
        ),
        (
            ("--max-iterations=0", "2GiB:sm80", "train.py"),
            "gpu_mem_track: --max-iterations must be at least 1",
        ),
        (
            ("--include=nosuchmodule", "2GiB:sm80", "train.py"),
            "gpu_mem_track: --include nosuchmodule: no such",
        ),
        (("2GiB:sm80", "."), "gpu_mem_track: . is a folder without a __main__.py, not a Python script"),
        (
            ("--batch-arg", "0", "--max-batch", "4", "2GiB:sm80", "train.py", "8"),
            "gpu_mem_track: --max-batch 4 is below the batch the script runs (8)",
        ),
        (
            ("--max-batch", "4", "2GiB:sm80", "train.py", "8"),
            "gpu_mem_track: --max-batch bounds the batch search: give --batch-arg too",
        ),
        (
            ("--nproc-per-node", "2", "--batch-arg", "0", "--max-batch", "4", "2GiB:sm80", "train.py", "8"),
            "gpu_mem_track: --max-batch 4 is below the batch the script runs (8)",
        ),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2(tmp_path, argv, message):
    (tmp_path / "train.py").write_text("raise SystemExit('the script must not run')\n")
    done = fit_cli(*argv, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(message)
    assert not (tmp_path / "reports").exists()  # no trial ran


def test_the_script_keeps_its_own_options(tmp_path):
    """Everything after the script is the script's, even a name fit itself takes."""
    (tmp_path / "train.py").write_text("")
    done = fit_cli("--batch-arg=--json", "H900", "train.py", "--json=3", cwd=tmp_path)
    assert done.returncode == 2 and "unknown GPU 'H900'" in done.stderr  # --json=3 went to the script


def test_help_names_every_option(tmp_path):
    done = fit_cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    for option in (
        "--threshold",
        "--levers",
        "--batch-arg",
        "--max-batch",
        "--jobs",
        "--out-dir",
        "--json",
        "--html",
        "--include",
        "--max-iterations",
        "--max-seconds",
        "--run-to-end",
        "--end-script",
        "--engine",
    ):
        assert option in done.stdout
    text = " ".join(done.stdout.split())
    assert "counted from 0 (the first argument after the script" in text
    assert "Exit codes: 0 it fits as asked" in text and "3 it fits only with a smaller batch" in text


def test_a_wrong_index_says_which_argument_it_took(tmp_path):
    (tmp_path / "train.py").write_text("raise SystemExit('the script must not run')\n")
    done = fit_cli("--batch-arg", "0", "2GiB:sm80", "train.py", "--seq", "1024", "32", cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "reports").exists()
    assert done.stderr.strip() == (
        "gpu_mem_track: --batch-arg 0 (counted from 0) took '--seq', the 1st argument after the script "
        "(sys.argv[1]): not a positive integer (0 is the first argument after the script)"
    )


def test_a_script_that_raises_is_answered_with_its_exception_and_line(tmp_path):
    (tmp_path / "bad.py").write_text('import torch\n\n\nraise ValueError("no data folder")\n')
    done = fit_cli("2GiB:sm80", "bad.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "failed for a reason other than memory (ValueError: no data folder (bad.py:4))" in done.stdout
    assert "trial baseline: failed (ValueError: no data folder (bad.py:4))" in done.stderr


@pytest.mark.parametrize("world", [(), ("--nproc-per-node", "2")])
def test_an_out_dir_that_cannot_be_written_is_one_line_before_any_trial(tmp_path, world):
    """--out-dir naming a file was a NotADirectoryError traceback once the first trial
    made its folder; it is a usage mistake, said before the script runs."""
    (tmp_path / "train.py").write_text("raise SystemExit('the script must not run')\n")
    (tmp_path / "taken").write_text("a file, not a folder\n")
    done = fit_cli(*world, "--out-dir", "taken/sub", "2GiB:sm80", "train.py", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "gpu_mem_track: cannot write reports to taken/sub: it cannot be created (taken is a file)"
    ]


def test_an_html_page_that_is_a_folder_is_refused_before_any_trial(tmp_path):
    """--html naming a folder failed ("Is a directory") only once every trial had run."""
    (tmp_path / "train.py").write_text("raise SystemExit('the script must not run')\n")
    (tmp_path / "pages").mkdir()
    done = fit_cli("--html", "pages", "2GiB:sm80", "train.py", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "gpu_mem_track: --html pages: a folder, not a page to write\n"
    assert not (tmp_path / "reports").exists()  # no trial ran


@pytest.mark.parametrize("option", ["--jobs", "--max-batch", "--nproc-per-node"])
@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_a_count_of_at_least_1_says_so_for_every_bad_value(option, value, capsys):
    """-1 was refused as "not a count >= 0", which 0 is, while 0 said ">= 1"."""
    from gpu_mem_track.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["fit", option, value, "2GiB:sm80", "train.py"])
    assert exit.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1].endswith(f"argument {option}: not a count >= 1: {value!r}")
    )


def test_an_interrupt_names_the_trials_never_started_apart_from_those_it_stopped(tmp_path, capsys):
    """Trials still waiting for a slot were listed as 'stopped, not complete' beside the
    ones stopped mid-run, though no folder or log of theirs exists (the pool tells them
    apart: ``test_fit.test_a_stopped_pool_tells_running_trials_from_those_never_started``)."""
    import signal

    from gpu_mem_track.advisor.api import FitInterrupted
    from gpu_mem_track.commands.fit import _say_interrupted

    stop = FitInterrupted(
        str(tmp_path), [str(tmp_path / "baseline")], ["expandable", "zero-w2"], signal.SIGTERM, ["fused"]
    )
    _say_interrupted(stop)
    assert capsys.readouterr().err.splitlines() == [
        "gpu_mem_track fit: interrupted (SIGTERM): every trial stopped, no process left",
        f"gpu_mem_track fit: complete trial folders (1): {tmp_path / 'baseline'}",
        f"gpu_mem_track fit: stopped, not complete (2): expandable, zero-w2 (under {tmp_path}/)",
        "gpu_mem_track fit: not started (1): fused",
    ]
