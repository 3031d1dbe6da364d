"""The command line: error cases and every command in process, the demo and one run per
command end to end in subprocesses (those that import torch there are marked slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_mem_track import MemTracker, read_stamps
from gpu_mem_track.cli import BUG_REPORT
from gpu_mem_track.commands import all_commands

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


@pytest.fixture
def two_stamps(quiet_tracker):
    """A CPU tracker CSV with two stamps (a tensor watched, then deleted) and its log."""
    tracker = quiet_tracker(run_name="r")
    kept = torch.zeros(10)
    tracker.watch(kept=kept)
    tracker.track("a")
    del kept
    tracker.track("b")
    return tracker.files


def test_show_renders_the_csv_as_the_text_log(two_stamps):
    done = run("-m", "gpu_mem_track", "show", str(two_stamps.csv))
    assert done.returncode == 0, done.stderr
    log = two_stamps.log.read_text().split("\n", 1)[1]  # after the header line
    assert done.stdout == log


def test_show_totals_only_leaves_out_the_groups(two_stamps, in_process):
    totals = in_process("show", "--totals-only", two_stamps.csv)
    assert totals.returncode == 0
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
        (("show", "data.bin"), 2, "gpu_mem_track: data.bin is not a gpu_mem_track report (a run folder"),
        (("probe", "--device", "cpu"), 2, "the probe measures CUDA devices, not 'cpu'"),
        (("probe", "--device", "gpu"), 2, "not a device: 'gpu'"),
        (("frobnicate",), 2, "invalid choice: 'frobnicate'"),
        ((), 2, "the following arguments are required: COMMAND"),
        (("run",), 2, "the following arguments are required: script\n"),  # not "script, args"
    ],
)
def test_usage_mistakes_exit_2_with_one_clear_line(tmp_path, monkeypatch, in_process, args, code, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "data.bin").write_bytes(bytes(range(128, 256)) * 8)  # binary: not "empty"
    done = in_process(*args)
    assert done.returncode == code
    assert message in done.stderr
    if message.startswith("gpu_mem_track: "):  # ours, not argparse's (which adds its usage line)
        assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_usage_mistake_end_to_end_is_one_line_and_exit_2(tmp_path):
    done = run("-m", "gpu_mem_track", "show", "missing.csv", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "gpu_mem_track: no such run or report: missing.csv\n"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_probe_without_cuda_exits_1_saying_why():
    done = run("-m", "gpu_mem_track", "probe")
    assert done.returncode == 1
    assert (
        done.stderr
        == "gpu_mem_track: CUDA is not available on this machine; the probe measures CUDA's own cost\n"
    )


def test_probe_prints_the_result_as_text_or_json(tmp_path, monkeypatch, in_process, probe_result):
    from gpu_mem_track.tracker import probe
    from gpu_mem_track.tracker.render import render_probe

    asked = []
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(probe, "run_probe", lambda device: asked.append(device) or probe_result)
    text = in_process("probe", "--device", "cuda:1")
    assert (text.returncode, text.stdout) == (0, render_probe(probe_result))
    assert text.stderr.startswith(f"saved for MemTracker: {tmp_path}")  # what track() reads later
    assert text.stderr.count("\n") == 1 and list(tmp_path.iterdir())
    as_json = in_process("probe", "--json")
    assert as_json.returncode == 0
    assert type(probe_result).from_dict(json.loads(as_json.stdout)) == probe_result
    assert asked == ["cuda:1", "cuda:0"]


def test_probe_that_cannot_run_here_exits_1_with_its_reason(monkeypatch, in_process):
    from gpu_mem_track.tracker import probe

    def no_nvml(device):
        raise probe.ProbeError("the probe needs nvidia-ml-py")

    monkeypatch.setattr(probe, "run_probe", no_nvml)
    done = in_process("probe")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "gpu_mem_track: the probe needs nvidia-ml-py\n"


@pytest.mark.parametrize("command", [c.name for c in all_commands()])
def test_every_command_has_help(in_process, command):
    done = in_process(command, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m gpu_mem_track {command}")
    assert "--" in done.stdout


def test_the_commands_are_listed_in_order_and_version_prints(in_process):
    names = [c.name for c in all_commands()]
    assert names == [
        "run",
        "probe",
        "show",
        "ranks",
        "compare",
        "plot",
        "estimate",
        "batch-size",
        "fit",
        "snapshot",
        "html",
        "gpus",
    ]
    top = in_process("--help")
    places = [top.stdout.find(f"\n    {name}") for name in names]
    assert top.returncode == 0 and -1 not in places and places == sorted(places)
    version = in_process("--version")
    assert version.returncode == 0 and version.stdout.startswith("gpu_mem_track 0.")


def _broken_compare(*args):
    raise KeyError("our own mistake")


def test_our_bug_is_a_traceback_exit_1_and_a_request_to_report_it(tmp_path, monkeypatch, in_process):
    from gpu_mem_track.runs import compare

    monkeypatch.setattr(compare, "compare_files", _broken_compare)
    done = in_process("compare", tmp_path, tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert "KeyError: 'our own mistake'" in done.stderr
    assert done.stderr.endswith(f"\ngpu_mem_track: {BUG_REPORT}\n")


@pytest.mark.parametrize(("raised", "code"), [(KeyboardInterrupt, 130), (BrokenPipeError, 0)])
def test_ctrl_c_and_a_closed_pipe_end_quietly(tmp_path, monkeypatch, in_process, raised, code):
    from gpu_mem_track.runs import compare

    def interrupted(*args):
        raise raised

    monkeypatch.setattr(compare, "compare_files", interrupted)
    done = in_process("compare", tmp_path, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (code, "", "")


def test_vgg19_has_torchvisions_parameter_count():
    from gpu_mem_track.examples.models import vgg19

    with torch.device("meta"):
        model = vgg19()
    assert sum(p.numel() for p in model.parameters()) == 143_667_240
    assert dict(model.named_parameters())["classifier.0.weight"].shape == (4096, 25088)


@pytest.mark.slow
def test_demo_reports_vgg19_training_step_on_cpu(tmp_path):
    done = run(
        str(ROOT / "scripts" / "tools" / "vgg_demo.py"),
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


def test_show_rejects_a_truncated_report_in_one_line(tmp_path, quiet_tracker, in_process):
    tracker = quiet_tracker(run_name="r")
    tracker.track("a")
    lines = tracker.files.csv.read_text().splitlines()
    (tmp_path / "cut.csv").write_text("\n".join([lines[0], lines[1][:25]]) + "\n")
    done = in_process("show", tmp_path / "cut.csv")
    assert done.returncode == 2
    assert "cut.csv, line 2: not a valid report row" in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


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


@pytest.mark.slow
@pytest.mark.parametrize("given", ["", "lines.csv"])
def test_show_prints_a_runs_report_from_its_folder_or_lines_csv(finished_run, given):
    # From the folder the run was started in: the report names files relative to it.
    done = run("-m", "gpu_mem_track", "show", str(finished_run / given), cwd=finished_run.parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout == (finished_run / "report.txt").read_text() and done.stderr == ""
    assert "Automatic censuses" in done.stdout  # read back from census.csv


@pytest.mark.slow
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


def test_show_keeps_the_complete_stamps_of_a_report_cut_mid_row(tmp_path, in_process):
    tracker = MemTracker(device="cpu", out_dir=tmp_path, run_name="r", verbosity=0, probe=False)
    tracker.track("a")
    tracker.track("b")
    text = tracker.files.csv.read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[: len(text) - 20])  # a process killed while writing stamp "b"
    # Stamp "b" is the file's last line; "a" has a row per tensor group this process holds
    # (none in a fresh process, more after other tests), so count them.
    last = len(text.splitlines())
    assert text.splitlines()[-1].split(",")[6:8] == ["b", "totals"]
    done = in_process("show", cut)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"gpu_mem_track: note: {cut}, line {last}: the last row is incomplete (the writing process "
        "stopped mid-row); read the complete rows before it\n"
    )
    assert done.stdout.count("At ") == 1 and "[a]" in done.stdout
