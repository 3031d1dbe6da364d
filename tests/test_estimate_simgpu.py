"""The estimator's CUDA target is the simulated GPU: a user's step with
``torch.autocast("cuda")`` inside is estimated as the GPU runs it, and ``torch.cuda``
answers inside the step."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest
import snapshotfiles as sf
import torch
from torch import nn

from gpu_mem_track import estimate, find_max_batch_size
from gpu_mem_track.errors import UsageError
from gpu_mem_track.estimator.specs import InputSpec
from gpu_mem_track.estimator.target import UNBOUNDED, DoesNotFit, target_spec
from gpu_mem_track.gpumodel.reduce import staging_bytes
from gpu_mem_track.simgpu import catalog, simulated_gpu


def block() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.LayerNorm(1024), nn.GELU(), nn.Linear(1024, 256))


def bf16_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: list) -> None:
    """The usual AMP loop body, as written for a GPU."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(*inputs).sum()
    loss.backward()
    optimizer.step()


def simulated_loop(step, batch: int = 64) -> tuple[int, int]:  # noqa: ANN001
    """The same loop run on the estimator's default simulated GPU: (max allocated, max
    reserved) over the second step, as ``torch.cuda`` reports them."""
    with simulated_gpu(target_spec()):
        model = block().cuda()
        optimizer = torch.optim.Adam(model.parameters())
        x = torch.randn(batch, 256, device="cuda")
        step(model, optimizer, [x])
        torch.cuda.reset_peak_memory_stats()
        step(model, optimizer, [x])
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def test_a_step_with_cuda_autocast_is_estimated_as_the_simulated_gpu_runs_it():
    est = estimate(block, (64, 256), step=bf16_step)
    assert (est.peak, est.reserved_peak) == simulated_loop(bf16_step)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))


def test_a_step_with_cuda_autocast_keeps_bfloat16_activations():
    """Before the estimator ran on the simulated GPU, ``torch.autocast("cuda")`` inside a
    step was disabled (no CUDA here) and the step ran in float32. In bfloat16 the two
    activations the MLP keeps for backward take half their float32 size (the inputs' and
    weights' bfloat16 copies come on top)."""
    amp = estimate(mlp, (2048, 256), step=bf16_step)
    fp32 = estimate(mlp, (2048, 256), step=lambda m, o, i: (o.zero_grad(), m(*i).sum().backward(), o.step()))
    assert amp.activation_bytes < 0.7 * fp32.activation_bytes
    assert amp.parameter_bytes == fp32.parameter_bytes  # float32 master weights


def test_the_amp_option_is_the_same_autocast_as_a_step_running_it():
    """``--amp bf16`` (the built-in step under autocast) and a user's step written with
    ``torch.autocast("cuda", dtype=torch.bfloat16)`` around forward and loss give the same
    figures: one autocast, CUDA's. The step drops its loss before the optimizer step, as
    the built-in one does."""

    def step(model, optimizer, inputs):  # noqa: ANN001
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(*inputs).sum()
        loss.backward()
        del loss
        optimizer.step()

    builtin = estimate(block, (64, 256), amp="bf16")
    user = estimate(block, (64, 256), step=step)
    figures = ("peak", "reserved_peak", "activation_bytes", "gradient_bytes", "optimizer_state_bytes")
    assert [getattr(builtin, f) for f in figures] == [getattr(user, f) for f in figures]


def test_torch_cuda_inside_a_step_reads_the_simulated_gpu():
    seen = []

    def step(model, optimizer, inputs):  # noqa: ANN001
        bf16_step(model, optimizer, inputs)
        seen.append((torch.cuda.is_available(), inputs[0].is_cuda, torch.cuda.max_memory_allocated()))

    est = estimate(block, (64, 256), step=step, warmup=0)
    assert seen[-1][:2] == (True, True)
    assert seen[-1][2] == est.peak  # nothing was allocated before the measured step


def test_the_gpu_option_names_an_architecture_or_a_gpu():
    assert target_spec().total_memory == UNBOUNDED and target_spec().capability == (8, 0)
    assert target_spec("hopper").cublas_workspace == 32 * 2**20
    assert target_spec("a100-40gb").name == "A100-40GB"
    hopper = estimate(block, (64, 256), gpu="hopper")
    h100 = estimate(block, (64, 256), gpu="H100-80GB")
    assert (hopper.peak, hopper.reserved_peak) == (h100.peak, h100.reserved_peak)
    with pytest.raises(UsageError, match=r"^unknown GPU 'tpu': choose an architecture"):
        estimate(block, (64, 256), gpu="tpu")


def biased_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


def backward_only(model, optimizer, inputs):  # noqa: ANN001
    model(*inputs).sum().backward()


def a100_loop(batch: int) -> tuple[int, int]:
    """:func:`backward_only` twice on ``run --simulate``'s A100-40GB: (max allocated, max
    reserved) over the second, as ``torch.cuda`` reports them."""
    with simulated_gpu("a100-40gb"):
        model = biased_mlp().cuda()
        x = torch.randn(batch, 64, device="cuda")
        backward_only(model, None, [x])
        torch.cuda.reset_peak_memory_stats()
        backward_only(model, None, [x])
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def test_an_architecture_takes_its_gpus_reduction_staging(monkeypatch):
    """The first layer's bias gradient sums 16,384 rows of 256 outputs: CUDA splits that sum
    over thread blocks and stages their partial sums in a 32 MiB buffer
    (``gpumodel.reduce``), as many as the GPU's SMs ask. ``gpu="ampere"`` has the A100's 108
    SMs (``catalog.ARCHITECTURE_GPUS``), so the estimate is the simulated A100's step byte
    for byte; with no SM count (as before) it took no staging: 32 MiB less reserved."""
    batch = 16384
    est = estimate(biased_mlp, (batch, 64), step=backward_only, optimizer="none", gpu="ampere")
    assert (est.peak, est.reserved_peak) == a100_loop(batch)
    assert target_spec("ampere").multiprocessors == 108
    assert est.phases[-1].phase == "backward" and est.phases[-1].op == "sum"
    monkeypatch.setattr(catalog, "ARCHITECTURE_GPUS", {})
    bare = estimate(biased_mlp, (batch, 64), step=backward_only, optimizer="none", gpu="ampere")
    staging = staging_bytes((batch, 256), [0], True, 108, 2048)
    assert est.reserved_peak - bare.reserved_peak == staging.buffer == 32 * 2**20
    assert est.peak > bare.peak


def wide() -> nn.Module:
    return nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096))


def test_a_step_that_outgrows_the_named_gpu_does_not_fit(in_process):
    """128 MiB of float32 weights, gradients and Adam's two states need 512 MiB: more than
    a 512 MiB GPU's capacity (its memory less a 128 MiB context)."""
    with pytest.raises(DoesNotFit, match=r"^the step does not fit on 512MiB:sm80: it would run") as caught:
        estimate(wide, (8, 4096), gpu="512MiB:sm80")
    assert caught.value.record.capacity == 384 * 2**20
    assert estimate(wide, (8, 4096), gpu="1GiB:sm80").peak > 512 * 2**20
    done = in_process("estimate", f"{__name__}:wide", "--input", "8x4096", "--gpu", "512MiB:sm80")
    assert done.returncode == 2 and "does not fit on 512MiB:sm80" in done.stderr


def test_batch_size_on_a_named_gpu_fits_its_capacity():
    found = find_max_batch_size(block, [(1, 256)], gpu="64MiB:sm80", budget_on="allocated")
    assert found.budget == 48 * 2**20 and "64MiB:sm80" in found.budget_source
    assert found.batch > 0 and found.peak <= found.budget
    assert estimate(block, (found.batch, 256), gpu="64MiB:sm80").peak == found.peak
    above = next(p for p in found.probes if p.batch == found.batch + 1)
    assert above.peak is None or above.peak > found.budget


@pytest.mark.slow
@pytest.mark.skipif(sf.FIXTURES is None, reason="../shared/fixtures/snapshots not present")
def test_the_recorded_autocast_forward_given_as_written_is_estimated_as_the_gpu_ran_it(monkeypatch):
    """The recorded mixed-precision forward of a 2.7B-parameter model, its step written with
    ``torch.autocast("cuda")`` inside (scripts/check/check_estimator_gpu.py): within 1.5% of the
    recording. With autocast disabled inside the step (before the estimator ran on the
    simulated GPU) it was 18.8% under."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "check" / "check_estimator_gpu.py"
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts scripts/ there for _common
    spec = importlib.util.spec_from_file_location("check_estimator_gpu", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    recorded = check.recorded(sf.FIXTURES / check.FORWARD_AMP)
    estimated = check.estimated_amp()
    for key in ("peak_allocated", "peak_reserved"):
        assert abs(estimated[key] / recorded[key] - 1) < 0.015, key


def encoder() -> nn.Module:
    return nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)


def test_multihead_attention_runs_the_attention_the_gpu_picks():
    """nn.MultiheadAttention calls ``F.multi_head_attention_forward``, which the simulated
    GPU runs with its face on (it recursed without end before): its attention takes the
    memory-efficient kernel (float32 on sm80), which keeps no 4 x 512 x 512 matrix per
    sample for backward, where the CPU's math path keeps the scores' softmax."""
    gpu = estimate(encoder, (2, 512, 64))
    cpu = estimate(encoder, (2, 512, 64), device="cpu")
    assert gpu.activation_elements + 2 * 4 * 512 * 512 <= cpu.activation_elements


def test_gradient_checkpointing_recomputes_on_the_simulated_gpu():
    """Backward runs with the face on, so a checkpointed block recomputed in backward takes
    the same attention kernel as its forward did (it took the math path, and
    torch.utils.checkpoint refused the different number of saved tensors)."""
    pytest.importorskip("transformers")
    from gpu_mem_track.estimator.specs import InputSpec
    from gpu_mem_track.examples import hf

    inputs = [InputSpec((8, 128), torch.int64), InputSpec((8, 128), torch.int64, "labels")]
    plain = estimate(hf.tiny_gpt2, inputs)
    checkpointed = estimate(functools.partial(hf.tiny_gpt2, checkpointing=True), inputs)
    assert checkpointed.activation_bytes < plain.activation_bytes


class TinyGPT(nn.Module):
    """A small GPT of the benchmark's kind (``scripts/bench/bench_simulate.py``): embeddings,
    pre-norm blocks with SDPA attention and a GELU MLP, an untied LM head."""

    def __init__(self, vocab: int = 1000, context: int = 64, d: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.ln1, self.ln2, self.ln = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        x = x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))
        return self.head(self.ln(x))


def gpt_loss(logits: torch.Tensor) -> torch.Tensor:
    targets = torch.zeros(logits.shape[:2], dtype=torch.long, device=logits.device)
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_estimate_equals_a_simulated_run_of_the_same_training_loop(amp: torch.dtype | None):
    """The loop as a user writes it (the model built on the CPU, then ``.cuda()``; AdamW;
    ``zero_grad(set_to_none=True)``) on the estimator's simulated GPU: its second step's
    peaks are ``estimate``'s (one warm-up step, the model made on meta by a factory)."""
    with simulated_gpu(target_spec()):
        model = TinyGPT().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        x = torch.randint(0, 1000, (4, 64), device="cuda")
        for _ in range(2):
            torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                loss = gpt_loss(model(x))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        simulated = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    est = estimate(
        TinyGPT, InputSpec((4, 64), torch.long), optimizer="adamw", loss_fn=gpt_loss, amp=amp or False
    )
    assert (est.peak, est.reserved_peak) == simulated
