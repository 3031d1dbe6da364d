"""The command line and the demo, end to end in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_mem_track import MemTracker, read_stamps

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def test_show_renders_the_csv_as_the_text_log(tmp_path):
    tracker = MemTracker(device="cpu", out_dir=tmp_path, run_name="r", verbosity=0, probe=False)
    kept = torch.zeros(10)
    tracker.watch(kept=kept)
    tracker.track("a")
    del kept
    tracker.track("b")
    done = run("-m", "gpu_mem_track", "show", str(tracker.files.csv))
    assert done.returncode == 0, done.stderr
    log = tracker.files.log.read_text().split("\n", 1)[1]  # after the header line
    assert done.stdout == log
    totals = run("-m", "gpu_mem_track", "show", "--totals-only", str(tracker.files.csv))
    assert "+ |" not in totals.stdout and totals.stdout.count("At ") == 2


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("show", "missing.csv"), 2, "gpu_mem_track: no such run or report: missing.csv\n"),
        (("show", "notes.txt"), 2, "gpu_mem_track: notes.txt is not a gpu_mem_track report (a run folder"),
        (
            ("show", "empty.csv"),
            2,
            "gpu_mem_track: empty.csv is empty (no CSV header): not a gpu_mem_track report\n",
        ),
        (("show", "."), 2, "gpu_mem_track: . is not a gpu_mem_track run folder (no meta.json"),
        (("probe", "--device", "cpu"), 2, "the probe measures CUDA devices, not 'cpu'"),
        (("frobnicate",), 2, "invalid choice: 'frobnicate'"),
        ((), 2, "the following arguments are required: COMMAND"),
    ],
)
def test_usage_mistakes_exit_2_with_one_clear_line(tmp_path, args, code, message):
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "empty.csv").write_text("")
    done = run("-m", "gpu_mem_track", *args, cwd=tmp_path)
    assert done.returncode == code
    assert message in done.stderr
    if message.startswith("gpu_mem_track: "):  # ours, not argparse's (which adds its usage line)
        assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_probe_without_cuda_exits_1_saying_why():
    done = run("-m", "gpu_mem_track", "probe")
    assert done.returncode == 1
    assert (
        done.stderr
        == "gpu_mem_track: CUDA is not available on this machine; the probe measures CUDA's own cost\n"
    )


@pytest.mark.parametrize("command", ["probe", "show"])
def test_every_command_has_help(command):
    done = run("-m", "gpu_mem_track", command, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout and "--" in done.stdout


def test_vgg19_has_torchvisions_parameter_count():
    from gpu_mem_track.examples.models import vgg19

    with torch.device("meta"):
        model = vgg19()
    assert sum(p.numel() for p in model.parameters()) == 143_667_240
    assert dict(model.named_parameters())["classifier.0.weight"].shape == (4096, 25088)


def test_demo_reports_vgg19_training_step_on_cpu(tmp_path):
    done = run(
        str(ROOT / "scripts" / "vgg_demo.py"),
        "--device",
        "cpu",
        "--image-size",
        "32",
        "--batch",
        "1",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "demo",
    )
    assert done.returncode == 0, done.stderr
    stamps = read_stamps(tmp_path / "demo.csv")
    labels = [s.label for s in stamps]
    assert labels == [
        "before building the model",
        "model built",
        "model on device",
        "forward",
        "backward",
        "optimizer step",
        "gradients released",
    ]
    by_label = {s.label: s for s in stamps}
    params = 574_668_960  # VGG-19: 143,667,240 float32 parameters
    assert by_label["before building the model"].ledger.tensors == 0
    assert by_label["model built"].ledger.tensors == params
    step = by_label["optimizer step"]
    adam = sum(c.bytes_delta for c in step.changes if c.kind == "Optimizer state")
    assert adam == 2 * params + 38 * 4  # exp_avg, exp_avg_sq, and a float32 step per parameter tensor
    grads = sum(c.bytes_delta for c in by_label["backward"].changes if c.kind == "Gradient")
    assert grads == params
    assert "At vgg_demo.py:" in done.stdout and "| cpu |" in done.stdout
    assert "classifier.0.weight" in done.stdout


def test_show_rejects_a_truncated_report_in_one_line(tmp_path):
    tracker = MemTracker(device="cpu", out_dir=tmp_path, run_name="r", verbosity=0, probe=False)
    tracker.track("a")
    lines = tracker.files.csv.read_text().splitlines()
    (tmp_path / "cut.csv").write_text("\n".join([lines[0], lines[1][:25]]) + "\n")
    done = run("-m", "gpu_mem_track", "show", str(tmp_path / "cut.csv"))
    assert done.returncode == 2
    assert "cut.csv, line 2: not a valid report row" in done.stderr
    assert "Traceback" not in done.stderr


SCRIPT = """\
data = [0] * 200_000
more = [1] * 400_000
del data
"""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real run of a small script: its folder, as the runner left it."""
    root = tmp_path_factory.mktemp("show")
    (root / "grow.py").write_text(SCRIPT)
    options = ("--device", "cpu", "--run-name", "grow", "--census-threshold", "1MiB")
    done = run("-m", "gpu_mem_track", "run", *options, "grow.py", cwd=root)
    assert done.returncode == 0, done.stderr
    return root / "reports" / "grow"


@pytest.mark.parametrize("given", ["", "lines.csv"])
def test_show_prints_a_runs_report_from_its_folder_or_lines_csv(finished_run, given):
    # From the folder the run was started in: the report names files relative to it.
    done = run("-m", "gpu_mem_track", "show", str(finished_run / given), cwd=finished_run.parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout == (finished_run / "report.txt").read_text() and done.stderr == ""
    assert "Automatic censuses" in done.stdout  # read back from census.csv


def test_show_summarises_a_timeline_and_a_run_killed_before_lines_csv(finished_run, tmp_path):
    timeline = run("-m", "gpu_mem_track", "show", str(finished_run / "timeline.csv"))
    assert timeline.returncode == 0, timeline.stderr
    assert timeline.stderr == (
        f"gpu_mem_track: note: {finished_run / 'timeline.csv'}: per-line figures rebuilt from this "
        "timeline (peaks as lower bounds, code text read from the sources now)\n"
    )
    assert "more = [1] * 400_000" in timeline.stdout and "gpu_mem_track run grow" in timeline.stdout
    killed = tmp_path / "killed"
    killed.mkdir()
    for name in ("meta.json", "timeline.csv"):
        (killed / name).write_bytes((finished_run / name).read_bytes())
    done = run("-m", "gpu_mem_track", "show", str(killed), cwd=finished_run.parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"gpu_mem_track: note: {killed} has no lines.csv")
    report = (finished_run / "report.txt").read_text()
    assert done.stdout.splitlines()[:3] == report.splitlines()[:3]  # the run's header
    assert "more = [1] * 400_000" in done.stdout


def test_show_keeps_the_complete_stamps_of_a_report_cut_mid_row(tmp_path):
    tracker = MemTracker(device="cpu", out_dir=tmp_path, run_name="r", verbosity=0, probe=False)
    tracker.track("a")
    tracker.track("b")
    text = tracker.files.csv.read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[: len(text) - 20])  # a process killed while writing stamp "b"
    done = run("-m", "gpu_mem_track", "show", str(cut))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"gpu_mem_track: note: {cut}, line 3: the last row is incomplete (the writing process "
        "stopped mid-row); read the complete rows before it\n"
    )
    assert done.stdout.count("At ") == 1 and "[a]" in done.stdout
