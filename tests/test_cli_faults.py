"""Command-line mistakes and odd scripts: the right usage, a message naming the problem,
and a script run as python runs it."""

from __future__ import annotations

import torch
from test_runner import folder, run, write

from gpu_mem_track import estimate
from gpu_mem_track.runfolder.files import read_lines


def test_an_unknown_run_option_prints_runs_usage(in_process, tmp_path):
    script = write(tmp_path / "train.py", "print('ran')\n")
    result = in_process("run", "--toppp", "3", str(script))
    assert result.returncode == 2
    assert result.stderr.startswith("usage: python -m gpu_mem_track run ")
    assert result.stderr.rstrip().endswith("run: error: unrecognized arguments: --toppp")
    assert "ran" not in result.stdout


def test_a_negative_budget_is_named_as_the_problem(in_process):
    result = in_process(
        "batch-size", "gpu_mem_track.examples:convnet", "--input", "1x3x32x32", "--budget", "-5GiB"
    )
    assert result.returncode == 2
    assert result.stderr == "gpu_mem_track: the memory budget must be positive, not -5GiB\n"


def test_estimate_takes_the_shape_text_the_command_line_takes():
    def factory():
        return torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 16, 4))

    by_text = estimate(factory, ["4x16:int64"], device="cpu")
    by_shape = estimate(factory, [torch.zeros(4, 16, dtype=torch.int64)], device="cpu")
    assert by_text.peak == by_shape.peak and by_text.inputs == ("4x16:int64",)
    assert estimate(torch.nn.Linear(256, 4), "64x256", device="cpu").peak == (
        estimate(torch.nn.Linear(256, 4), (64, 256), device="cpu").peak
    )


def test_a_folder_with_main_runs_as_python_runs_it(tmp_path):
    (tmp_path / "app").mkdir()
    write(
        tmp_path / "app" / "__main__.py",
        """
        import sys
        import helper
        print(__name__, sys.argv, sys.path[0].endswith("app"), helper.VALUE)
        """,
    )
    write(tmp_path / "app" / "helper.py", "VALUE = 42\n")
    done = run(tmp_path, "app", "--flag")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "__main__ ['app', '--flag'] True 42\n"
    lines = read_lines(folder(tmp_path) / "lines.csv")
    assert {(r.file.endswith("__main__.py"), r.line) for r in lines} >= {(True, 2), (True, 4)}


def test_a_folder_without_main_is_refused_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    done = run(tmp_path, "empty")
    assert done.returncode == 2
    assert done.stderr == "gpu_mem_track: empty is a folder without a __main__.py, not a Python script\n"


def test_a_script_with_nul_bytes_names_the_file_in_its_syntax_error(tmp_path):
    (tmp_path / "binary.py").write_bytes(b"x = 1\n\x00\x01\x02")
    done = run(tmp_path, "binary.py")
    assert done.returncode == 1
    assert 'binary.py", line 2' in done.stderr
    assert "SyntaxError: source code cannot contain null bytes" in done.stderr
