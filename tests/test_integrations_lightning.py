"""``LightningMemTrackCallback`` with the real ``lightning.Trainer`` (and
``pytorch_lightning.Trainer``) on the CPU: a small ``LightningModule`` trained for three
steps."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu_mem_track.tracker.csvlog import read_stamps
from gpu_mem_track.units import cuda_block_bytes

FRAMEWORKS = ("lightning", "pytorch_lightning")
ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.usefixtures("one_process"),
    # Lightning 2.6 builds torch's pytree LeafSpec, which torch 2.13 deprecates
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated:FutureWarning"),
]


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    """(the framework package, its callback class) for ``lightning`` and ``pytorch_lightning``."""
    package = pytest.importorskip(request.param)
    integration = importlib.import_module(f"gpu_mem_track.integrations.{request.param}")
    return package, integration.LightningMemTrackCallback


def classifier_module(package, fail: bool = False):
    class Classifier(package.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

        def training_step(self, batch, batch_idx):
            x, y = batch
            if fail:
                raise RuntimeError("the model's own failure")
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    return Classifier()


def fit(package, callback, module, steps=3, accelerator="cpu"):
    data = torch.utils.data.TensorDataset(torch.randn(16, 32), torch.randint(0, 4, (16,)))
    trainer = package.Trainer(
        max_steps=steps,
        accelerator=accelerator,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))


def names(stamp, kind):
    return {n for c in stamp.changes if c.kind == kind and c.bytes_delta > 0 for n in c.names}


@pytest.mark.slow
def test_trainer_stamps_the_first_step_and_every_n_steps_in_one_run_folder(tmp_path, framework):
    package, callback_class = framework
    callback = callback_class(every=2, out_dir=tmp_path / "reports", run_name="net", verbosity=0, probe=False)
    module = classifier_module(package)
    fit(package, callback, module)
    assert callback.folder == tmp_path / "reports" / "net"
    assert sorted(p.name for p in callback.folder.iterdir()) == ["tracker.csv", "tracker.log"]
    stamps = read_stamps(callback.folder / "tracker.csv")
    assert [s.label for s in stamps] == [
        "train start",
        "step 1 forward",
        "step 1 backward",
        "step 1 optimizer step",
        "step 2",
        "train end",
    ]
    assert {(s.file, s.function) for s in stamps} == {(__file__, "fit")}  # the trainer.fit() line
    by = {s.label: s for s in stamps}
    assert names(by["train start"], "Parameter") == {
        "net.0.weight",
        "net.0.bias",
        "net.2.weight",
        "net.2.bias",
    }
    assert any(n.endswith("(net.1)") for n in names(by["step 1 forward"], "Activation"))  # the ReLU's output
    assert by["step 1 backward"].ledger.categories.activation == 0
    assert "net.0.weight.grad" in names(by["step 1 backward"], "Gradient")
    params = list(module.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    optimizer = by["step 1 optimizer step"]
    assert {"exp_avg of net.0.weight", "exp_avg_sq of net.0.weight"} <= names(optimizer, "Optimizer state")
    assert optimizer.ledger.categories.optimizer_state == 2 * param_bytes + 4 * len(params)
    # Lightning zeroes gradients when the next step starts: they are still there after the step
    assert optimizer.ledger.categories.gradient == param_bytes


@pytest.mark.slow
def test_on_the_gpu_the_stamps_read_the_allocator(tmp_path, framework, gpu):
    package, callback_class = framework
    callback = callback_class(every=2, out_dir=tmp_path / "reports", run_name="g", verbosity=0, probe=False)
    module = classifier_module(package)
    fit(package, callback, module, accelerator="gpu")
    assert callback.tracker.device == "cuda:0"
    by = {s.label: s for s in read_stamps(callback.folder / "tracker.csv")}
    blocks = sum(cuda_block_bytes(p.numel() * p.element_size()) for p in module.parameters())
    start = by["train start"].ledger
    assert (start.categories.parameter, start.allocated) == (blocks, blocks)  # on the GPU, and only they
    forward = by["step 1 forward"]
    assert any(n.endswith("(net.1)") for n in names(forward, "Activation"))  # the ReLU's output
    assert {n.split(":")[0] for n in names(forward, "Activation")} == {
        "saved at test_integrations_lightning.py"
    }
    step = by["step 1 optimizer step"].ledger
    # Adam (neither fused nor capturable): its step counters stay on the CPU
    assert (step.categories.gradient, step.categories.optimizer_state) == (blocks, 2 * blocks)
    for stamp in by.values():
        ledger = stamp.ledger
        assert ledger.tensors + ledger.hidden == ledger.allocated <= ledger.reserved
    assert by["step 1 backward"].ledger.hidden >= 2 * 8_519_680  # the cuBLAS workspaces


@pytest.mark.slow
def test_a_failing_training_step_leaves_no_recording(tmp_path, framework):
    package, callback_class = framework
    callback = callback_class(out_dir=tmp_path / "reports", run_name="bad", verbosity=0, probe=False)
    with pytest.raises(RuntimeError, match="the model's own failure"):
        fit(package, callback, classifier_module(package, fail=True))
    assert [s.label for s in read_stamps(callback.folder / "tracker.csv")] == ["train start"]


DDP_SCRIPT = """
import lightning, torch
from torch import nn
from gpu_mem_track.integrations.lightning import LightningMemTrackCallback


class Net(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).square().sum()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())


if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(32, 8))
    callback = LightningMemTrackCallback(every=2, out_dir="reports", run_name="ddp", probe=False)
    trainer = lightning.Trainer(
        max_steps=3, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=4))
"""


@pytest.mark.slow
def test_under_torchrun_each_rank_writes_in_one_launch_folder_and_rank_0_prints(tmp_path):
    pytest.importorskip("lightning")
    (tmp_path / "train.py").write_text(textwrap.dedent(DDP_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    launch = tmp_path / "reports" / "ddp"
    assert sorted(p.name for p in launch.iterdir()) == ["rank0", "rank1"]
    for rank in (0, 1):
        stamps = read_stamps(launch / f"rank{rank}" / "tracker.csv")
        assert [s.label for s in stamps][-3:] == ["step 1 optimizer step", "step 2", "train end"]
    assert done.stdout.count("[train start]") == 1  # rank 0 only
