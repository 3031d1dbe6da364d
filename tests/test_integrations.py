"""The trainer integrations' shared session (``integrations.session``), driven without a
framework: the stamps of a training run, the run folder (one process, ranks, inside
``gpu_mem_track run``), the options, and the message when a framework is missing."""

from __future__ import annotations

import ast
import importlib
import io
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu_mem_track.errors import UsageError
from gpu_mem_track.integrations.session import LABELS, TrainingSession, missing_extra, user_frame
from gpu_mem_track.tracker.csvlog import read_stamps
from gpu_mem_track.tracker.listeners import listening

PACKAGE = Path(__file__).resolve().parents[1] / "gpu_mem_track"
pytestmark = pytest.mark.usefixtures("one_process")


def session(tmp_path, **options):
    defaults = dict(out_dir=tmp_path / "reports", run_name="run", verbosity=0, probe=False)
    return TrainingSession(**{**defaults, **options})


def train(run: TrainingSession, steps: int, accumulate: int = 1) -> nn.Module:
    """A small Adam training loop driving ``run`` as a framework callback would."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters())
    run.start(model, [optimizer])
    for step in range(1, steps + 1):
        for _ in range(accumulate):
            run.first_forward_begins()
            loss = model(torch.randn(4, 8)).square().sum()
            run.first_step_event("step 1 forward")
            loss.backward()
            run.step_end(step - 1)  # a micro-batch ends: no new optimizer step yet
        run.first_step_event("step 1 backward")
        optimizer.step()
        run.first_step_event("step 1 optimizer step")
        optimizer.zero_grad()
        run.step_end(step)
    run.end()
    return model


def labels(run: TrainingSession) -> list[str]:
    return [s.label for s in read_stamps(run.folder / "tracker.csv")]


def test_a_run_stamps_the_first_step_then_every_n_steps(tmp_path):
    run = session(tmp_path, every=2)
    train(run, steps=5)
    assert run.folder == tmp_path / "reports" / "run"
    assert sorted(p.name for p in run.folder.iterdir()) == ["tracker.csv", "tracker.log"]
    first = ["train start", "step 1 forward", "step 1 backward", "step 1 optimizer step"]
    assert labels(run) == [*first, "step 2", "step 4", "train end"]
    assert LABELS[:4] == tuple(first)


def test_every_zero_stamps_the_first_step_only_and_accumulation_counts_optimizer_steps(tmp_path):
    run = session(tmp_path, every=0)
    train(run, steps=3)
    assert labels(run)[-2:] == ["step 1 optimizer step", "train end"]
    run = session(tmp_path, every=1, run_name="accumulating")
    train(run, steps=3, accumulate=2)
    assert labels(run)[4:] == ["step 2", "step 3", "train end"]


def test_the_census_names_parameters_gradients_optimizer_state_and_activations(tmp_path):
    run = session(tmp_path, every=0)
    model = train(run, steps=1)
    stamps = {s.label: s for s in read_stamps(run.folder / "tracker.csv")}
    params = sum(p.numel() * 4 for p in model.parameters())

    def names(label, kind):
        return {n for c in stamps[label].changes if c.kind == kind and c.bytes_delta > 0 for n in c.names}

    assert names("train start", "Parameter") == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert any(n.endswith("(1)") for n in names("step 1 forward", "Activation"))  # the ReLU saved its output
    assert stamps["step 1 forward"].ledger.categories.activation > 0
    assert stamps["step 1 backward"].ledger.categories.activation == 0
    assert "0.weight.grad" in names("step 1 backward", "Gradient")
    assert {"exp_avg of 0.weight", "exp_avg_sq of 0.weight", "step of 0.weight"} <= names(
        "step 1 optimizer step", "Optimizer state"
    )
    # Adam: two float32 states per parameter element and one float32 step per parameter tensor
    assert stamps["step 1 optimizer step"].ledger.categories.optimizer_state == 2 * params + 4 * 4


def test_activations_false_records_nothing_and_recording_never_outlives_the_forward(tmp_path):
    run = session(tmp_path, every=0, activations=False)
    train(run, steps=1)
    forward = next(s for s in read_stamps(run.folder / "tracker.csv") if s.label == "step 1 forward")
    assert forward.ledger.categories.activation == 0
    run = session(tmp_path, run_name="stopped")
    run.start(nn.Linear(2, 2))
    run.first_forward_begins()
    run.stop_recording()  # what the callbacks do when forward raised; the autouse fixture checks the hooks
    run.stop_recording()


def test_run_names_are_not_reused(tmp_path):
    first, second = session(tmp_path), session(tmp_path)
    first.start(nn.Linear(2, 2))
    second.start(nn.Linear(2, 2))
    assert (first.folder.name, second.folder.name) == ("run", "run-2")


def test_no_files_with_out_dir_none(tmp_path):
    run = session(tmp_path, out_dir=None, every=1)
    train(run, steps=2)
    assert run.folder is None and run.tracker.files is None
    assert list(run.tracker.to_dataframe().query("row == 'totals'")["label"])[-1] == "train end"


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_writes_in_the_launch_folder_and_only_rank_0_prints(tmp_path, monkeypatch, rank):
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job7"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stream = io.StringIO()
    run = TrainingSession(out_dir=tmp_path, run_name="launch", probe=False, stream=stream)
    run.start(nn.Linear(2, 2))
    assert run.folder == tmp_path / "launch" / f"rank{rank}"
    assert (run.folder / "tracker.csv").exists()
    assert ("[train start]" in stream.getvalue()) == (rank == 0)


def test_inside_gpu_mem_track_run_the_stamps_go_to_the_runs_folder(tmp_path, monkeypatch):
    class Runner:
        folder = tmp_path / "the-run"

        def on_stamp(self, tracker, stamp):
            self.seen = stamp.label

    Runner.folder.mkdir()
    monkeypatch.chdir(tmp_path)
    runner = Runner()
    with listening(runner):
        run = TrainingSession(verbosity=0, probe=False)  # the default out_dir, "reports"
        run.start(nn.Linear(2, 2))
    assert run.folder == Runner.folder and (Runner.folder / "tracker.csv").exists()
    assert runner.seen == "train start" and not (tmp_path / "reports").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(every=-1), "every must be a whole number"),
        (dict(every=2.5), "every must be a whole number"),
        (dict(censsus="full"), "unknown option 'censsus'"),
        (dict(path="x"), "unknown option 'path'"),
    ],
)
def test_option_mistakes_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        TrainingSession(**options)


def test_a_stamp_records_the_users_line(tmp_path):
    run = session(tmp_path)
    run.start(nn.Linear(2, 2))
    (stamp,) = read_stamps(run.folder / "tracker.csv")
    assert (stamp.file, stamp.function) == (__file__, "test_a_stamp_records_the_users_line")
    frame = user_frame([str(Path(__file__).parent)])  # every frame of this file is skipped
    assert frame is None or Path(frame.f_code.co_filename).parent != Path(__file__).parent
    del frame


def test_a_missing_framework_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "gpu_mem_track.integrations.hf", raising=False)
    with pytest.raises(ImportError, match=r'needs transformers.*pip install "gpu_mem_track\[hf\]"'):
        importlib.import_module("gpu_mem_track.integrations.hf")
    other = ModuleNotFoundError("No module named 'regex'", name="regex")
    assert missing_extra(other, ("transformers",), "hf", "x") is None  # a broken install: re-raised


def test_the_core_package_never_imports_a_framework():
    frameworks = {"transformers", "accelerate", "lightning", "pytorch_lightning"}
    for path in PACKAGE.rglob("*.py"):
        # integrations/ and the example models (examples/hf.py builds Hugging Face models
        # when named on the command line) import a framework; nothing else may.
        if path.parent.name in ("integrations", "examples"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not found & frameworks, f"{path} imports {found & frameworks}"


def screen(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: a carriage return goes back to the start
    of the line and overwrites."""
    shown = []
    for raw in text.split("\n"):
        line = ""
        for part in raw.split("\r"):
            line = part + line[len(part) :]
        shown.append(line.rstrip())
    return shown


def test_stamps_start_on_a_fresh_line_beside_a_tqdm_bar(tmp_path):
    tqdm = pytest.importorskip("tqdm")
    terminal = io.StringIO()  # the bar and the stamps share one terminal
    run = session(tmp_path, verbosity=1, stream=terminal)
    bar = tqdm.tqdm(total=10, file=terminal, ascii=True, mininterval=0, desc="train")
    bar.update(3)
    try:
        train(run, steps=1)
    finally:
        bar.close()
    stamps = [line for line in screen(terminal.getvalue()) if "[train start]" in line]
    assert stamps and all(line.startswith("At ") for line in stamps), stamps
    assert any(line.startswith("train:") for line in screen(terminal.getvalue()))
