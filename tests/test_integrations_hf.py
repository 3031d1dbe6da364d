"""``HFMemTrackCallback`` with the real ``transformers.Trainer`` on the CPU: a tiny randomly
initialised GPT-2 (nothing downloaded) trained for three steps on token ids in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gpu_mem_track

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from gpu_mem_track.integrations.hf import HFMemTrackCallback  # noqa: E402
from gpu_mem_track.tracker.csvlog import read_stamps  # noqa: E402
from gpu_mem_track.units import cuda_block_bytes  # noqa: E402

# transformers 5.23 and accelerate 1.15 warn about nothing here: no filters needed.
pytestmark = pytest.mark.usefixtures("one_process")


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64))


def token_ids(count: int = 8, length: int = 16, high: int = 128) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, high, (length,), generator=generator) for _ in range(count)]
    return [{"input_ids": row, "labels": row.clone()} for row in rows]


def train(tmp_path, callback, data=None, steps=3, use_cpu=True) -> GPT2LMHeadModel:
    model = tiny_gpt2()
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=steps,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=use_cpu,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=data or token_ids(), callbacks=[callback]).train()
    return model


def names(stamp, kind):
    return {n for c in stamp.changes if c.kind == kind and c.bytes_delta > 0 for n in c.names}


@pytest.mark.slow
def test_trainer_stamps_the_first_step_and_every_n_steps_in_one_run_folder(tmp_path):
    reports = tmp_path / "reports"
    callback = HFMemTrackCallback(every=2, out_dir=reports, run_name="gpt2", verbosity=0, probe=False)
    model = train(tmp_path, callback)
    assert callback.folder == reports / "gpt2"
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
    assert {(s.file, s.function) for s in stamps} == {(__file__, "train")}  # the trainer.train() line
    by = {s.label: s for s in stamps}
    assert {"transformer.h.0.attn.c_attn.weight", "transformer.wte.weight"} <= names(
        by["train start"], "Parameter"
    )
    forward = by["step 1 forward"]
    assert forward.ledger.categories.activation > 0
    assert any("(transformer.h.0.mlp.act)" in n for n in names(forward, "Activation"))
    assert "input input_ids of GPT2LMHeadModel" in names(forward, "Input")
    backward = by["step 1 backward"]
    assert backward.ledger.categories.activation == 0
    assert "transformer.h.0.attn.c_attn.weight.grad" in names(backward, "Gradient")
    params = list(model.parameters())  # lm_head.weight is transformer.wte.weight: counted once
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    assert backward.ledger.categories.gradient == param_bytes
    optimizer = by["step 1 optimizer step"]
    assert {
        "exp_avg of transformer.h.0.attn.c_attn.weight",
        "exp_avg_sq of transformer.h.0.attn.c_attn.weight",
    } <= names(optimizer, "Optimizer state")
    # AdamW: exp_avg and exp_avg_sq per parameter, and a float32 step per parameter tensor
    assert optimizer.ledger.categories.optimizer_state == 2 * param_bytes + 4 * len(params)
    assert by["step 2"].ledger.categories.gradient == 0  # zero_grad(set_to_none) before on_step_end
    assert by["step 2"].ledger.categories.optimizer_state == optimizer.ledger.categories.optimizer_state


@pytest.mark.slow
def test_a_forward_that_raises_leaves_no_hook_and_no_recording(tmp_path):
    callback = HFMemTrackCallback(out_dir=tmp_path / "reports", run_name="bad", verbosity=0, probe=False)
    with pytest.raises(IndexError):
        train(tmp_path, callback, data=token_ids(high=1000))  # ids past the vocabulary
    assert callback._hook is None and not callback.session._recording
    assert [s.label for s in read_stamps(callback.folder / "tracker.csv")] == ["train start"]


@pytest.mark.slow
def test_on_the_gpu_the_stamps_read_the_allocator_and_name_the_models_lines(tmp_path, gpu):
    callback = HFMemTrackCallback(
        every=2, out_dir=tmp_path / "reports", run_name="g", verbosity=0, probe=False
    )
    model = train(tmp_path, callback, use_cpu=False)
    assert model.transformer.wte.weight.is_cuda and callback.tracker.device == "cuda:0"
    by = {s.label: s for s in read_stamps(callback.folder / "tracker.csv")}
    params = list(model.parameters())
    blocks = sum(cuda_block_bytes(p.numel() * p.element_size()) for p in params)  # small blocks
    start = by["train start"].ledger
    assert start.categories.parameter == blocks and start.allocated == start.tensors  # loss accumulator
    forward = by["step 1 forward"]
    activations = names(forward, "Activation")
    assert any("(transformer.h.0.mlp.act)" in n for n in activations)
    # The sites are the model's lines, never our own (the simulated GPU's frames included).
    ours = {p.name for p in Path(gpu_mem_track.__file__).parent.rglob("*.py")}
    sites = {n.split()[2].split(":")[0] for n in activations}
    assert "modeling_gpt2.py" in sites and not sites & ours, sites
    backward = by["step 1 backward"]
    assert backward.ledger.categories.gradient == blocks and backward.ledger.categories.activation == 0
    optimizer = by["step 1 optimizer step"].ledger
    # fused/foreach AdamW on CUDA: exp_avg and exp_avg_sq, and a float32 step per parameter
    # tensor, each in its own 512-byte block
    assert optimizer.categories.optimizer_state == 2 * blocks + 512 * len(params)
    for stamp in by.values():  # the ledger reconciles with the allocator's own counters
        ledger = stamp.ledger
        assert ledger.allocated == ledger.tensors + ledger.hidden and ledger.reserved >= ledger.allocated
