"""Training loops run unchanged on the simulated GPU: AMP with GradScaler and fused AdamW,
an out-of-memory error caught to halve the batch, a memory snapshot dumped and read back
by the snapshot reader and the allocator replay, a pinned-memory DataLoader."""

from __future__ import annotations

import pickle
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpu_mem_track.allocator.replay import replay_snapshot
from gpu_mem_track.simgpu import simulated_gpu
from gpu_mem_track.snapshotfile.load import load_snapshot

HERE = __file__


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(
        self, vocab: int = 512, d: int = 64, heads: int = 4, layers: int = 2, context: int = 64
    ) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def train(
    steps: int, batch: int, model: nn.Module, log: list[str], context: int = 64
) -> torch.optim.Optimizer:
    """A user's AMP training loop, as written for a real GPU; returns its optimizer."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    for step in range(steps):
        x = torch.randint(0, 512, (batch, context)).to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            logits, loss = model(x, x)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        log.append(f"step {step} loss {loss.item():.3f} logits {logits.dtype}")
    return opt


def test_an_amp_training_loop_runs_with_fused_adamw_and_cuda_memory_figures():
    log: list[str] = []
    with simulated_gpu("a100-40gb") as gpu:
        model = TinyGPT()
        opt = train(3, 8, model, log)
        params = sum(p.numel() * 4 for p in model.parameters())
        states = [s["exp_avg"] for s in opt.state.values()]
        allocated, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        assert all(p.is_cuda and p.grad is None for p in model.parameters())
    assert log == [f"step {i} loss 0.000 logits torch.float16" for i in range(3)]
    assert len(states) == len(list(model.parameters()))
    # parameters + AdamW's two states + fused step counters + two cuBLAS workspaces (forward, backward)
    # + cuBLASLt's 1 MiB (the biased linears' addmm, gpumodel.reduce)
    workspaces = 2 * 8_519_680 + (1 << 20)
    assert 3 * params + workspaces <= allocated < 3 * params + workspaces + (1 << 20)
    assert peak > allocated + params  # gradients and activations at the peak
    assert gpu.out_of_memory is None
    assert {(p.filename, p.op) for p in gpu.placeholders} == {(HERE, "item")}


def test_out_of_memory_is_raised_where_the_gpu_runs_out_and_halving_the_batch_works():
    batch, log, tried = 256, [], []
    with simulated_gpu("1GiB:sm80") as gpu:
        model = TinyGPT(d=128, context=256)
        while True:
            try:
                tried.append(batch)
                train(1, batch, model, log, context=256)
                break
            except torch.cuda.OutOfMemoryError as exc:
                message = str(exc)
                batch //= 2
                model.zero_grad(set_to_none=True)
    assert len(tried) > 1 and log
    assert message.startswith("CUDA out of memory. Tried to allocate ")
    assert "GPU 0 has a total capacity of 1024.00 MiB of which " in message
    assert "is reserved by PyTorch but unallocated." in message
    oom = gpu.out_of_memory
    assert oom is not None and oom.filename == HERE and oom.capacity == gpu.spec.capacity
    assert oom.reserved <= oom.capacity < oom.reserved + oom.request
    assert gpu.allocator.stats.num_ooms >= 1


def test_uncaught_out_of_memory_names_the_users_line():
    with (
        pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 2.00 GiB"),
        simulated_gpu("1GiB:sm80") as gpu,
    ):
        torch.empty(2**29, device="cuda")
    assert gpu.out_of_memory.line == sys._getframe().f_lineno - 1


def test_a_dumped_snapshot_reads_back_and_replays_decision_for_decision(tmp_path):
    path = tmp_path / "snap.pickle"
    with simulated_gpu("h100-80gb"):
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        train(2, 4, TinyGPT(), [])
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        allocated = torch.cuda.memory_allocated()
    snapshot = load_snapshot(path)
    trace = snapshot.device_trace(0)
    assert {e.action for e in trace} >= {"alloc", "free_requested", "free_completed", "segment_alloc"}
    assert any(f.filename == HERE for e in trace if e.action == "alloc" for f in e.frames)
    live = sum(b.size for s in snapshot.segments for b in s.blocks if b.state == "active_allocated")
    assert live == allocated
    report = replay_snapshot(snapshot)
    assert report.all_match, report.mismatches
    from torch.cuda import _memory_viz

    data = pickle.loads(path.read_bytes())
    assert "<html>" in _memory_viz.trace_plot(data) and "<html>" in _memory_viz.segment_plot(data)


def test_a_pinned_memory_dataloader_keeps_real_cpu_batches():
    data = TensorDataset(torch.arange(32).view(16, 2))
    seen = []
    with simulated_gpu("t4"):
        for (batch,) in DataLoader(data, batch_size=4, pin_memory=True):
            seen.append(batch.tolist())
            batch.cuda(non_blocking=True)
    assert seen[0] == [[0, 1], [2, 3], [4, 5], [6, 7]] and len(seen) == 4


def test_a_memory_fraction_limits_the_simulated_gpu_as_on_the_real_one():
    with simulated_gpu("a100-40gb") as gpu:
        torch.cuda.set_per_process_memory_fraction(0.25)
        with pytest.raises(torch.OutOfMemoryError, match=r"in use\. 9\.90 GiB allowed; Of the allocated"):
            torch.empty(3 * 2**30, dtype=torch.float32, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        assert start.elapsed_time(end) > 0
    assert gpu.out_of_memory.request == 12 * 2**30


def test_the_allocator_frees_its_cache_and_retries_before_running_out():
    with simulated_gpu("1GiB:sm80") as gpu:
        assert gpu.spec.capacity == 768 * 2**20
        x = torch.empty(600 * 2**20, dtype=torch.uint8, device="cuda")
        del x
        assert torch.cuda.memory_reserved() == 600 * 2**20  # cached, not released
        y = torch.empty(700 * 2**20, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_reserved() == 700 * 2**20 and gpu.out_of_memory is None
        del y


def test_an_lstm_runs_forward_and_backward_without_cudnn_warnings():
    with simulated_gpu("t4"):
        lstm = nn.LSTM(16, 32, batch_first=True).cuda()
        out, _ = lstm(torch.randn(2, 5, 16, device="cuda"))
        out.sum().backward()
        assert out.shape == (2, 5, 32) and lstm.weight_ih_l0.grad.is_cuda


def test_a_long_loop_keeps_no_history_of_its_storages():
    with simulated_gpu("t4") as gpu:
        w = torch.randn(64, 64, device="cuda", requires_grad=True)
        for _ in range(50):
            (w @ w).sum().backward()
        assert gpu.storages.events == [] and gpu.storages.sizes == []
        assert gpu.storages.followed <= 8 and gpu.allocator.events == []


class EinsumLM(nn.Module):
    """A small model in the recorded 2.7B model's style: bias-free einsum projections,
    RMS norm, hand-written attention softmax, SwiGLU, float32."""

    def __init__(self, vocab: int = 1000, d: int = 128, layers: int = 2, ff: int = 512) -> None:
        super().__init__()
        self.emb = nn.Parameter(torch.randn(vocab, d))
        self.qkvo = nn.ParameterList(nn.Parameter(torch.randn(4, d, d)) for _ in range(layers))
        self.ff = nn.ParameterList(nn.Parameter(torch.randn(3, ff, d)) for _ in range(layers))
        self.head = nn.Parameter(torch.randn(vocab, d))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb[ids]
        t = ids.shape[1]
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=ids.device))
        for w, f in zip(self.qkvo, self.ff):
            h = x / torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True) + 1e-5)
            q, k, v = (torch.einsum("...i,oi->...o", h, w[i]) for i in range(3))
            s = torch.einsum("bqd,bkd->bqk", q, k).masked_fill(~mask, float("-inf"))
            e = torch.exp(s - s.amax(-1, keepdim=True))
            x = x + torch.einsum(
                "...i,oi->...o", torch.einsum("bqk,bkd->bqd", e / e.sum(-1, keepdim=True), v), w[3]
            )
            a, b = torch.einsum("...i,oi->...o", x, f[0]), torch.einsum("...i,oi->...o", x, f[2])
            x = x + torch.einsum("...i,io->...o", a * torch.sigmoid(a) * b, f[1])
        return torch.einsum("...i,oi->...o", x, self.head)


def test_a_small_model_of_the_recorded_kind_steps_and_replays_with_plausible_figures(tmp_path):
    with simulated_gpu("h100-80gb"):
        model = EinsumLM().cuda()
        ids = torch.randint(0, 1000, (4, 64)).cuda()
        params = sum(p.numel() * 4 for p in model.parameters())
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        torch.cuda.empty_cache()
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
        optimizer.step()
        torch.cuda.memory._dump_snapshot(str(tmp_path / "step.pickle"))
        peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    # parameters, gradients and the two AdamW states live at the end, with the logits
    workspaces = 2 * 32 * 2**20
    logits_bytes = 4 * 64 * 1000 * 4
    assert 4 * params + workspaces <= after <= 4 * params + workspaces + logits_bytes + (4 << 20)
    assert after < peak < after + 16 * logits_bytes
    assert replay_snapshot(load_snapshot(tmp_path / "step.pickle")).all_match


def test_a_line_sampler_reads_window_peaks_without_touching_torchs_peaks():
    with simulated_gpu("t4") as gpu:
        gpu.memory.mark()
        x = torch.empty(2**20, device="cuda")  # 4 MiB
        del x
        y = torch.empty(2**18, device="cuda")  # 1 MiB
        allocated_peak, reserved_peak = gpu.memory.mark()
        assert (allocated_peak, reserved_peak) == (
            4 << 20,
            22 << 20,
        )  # a 20 MiB segment, then a 2 MiB small one
        assert gpu.memory.mark() == (1 << 20, 22 << 20)  # the new window starts from what is live
        assert torch.cuda.max_memory_allocated() == 4 << 20
        del y


def test_empty_cache_records_a_segment_free_per_released_segment_with_its_frames(tmp_path):
    path = tmp_path / "snap.pickle"
    with simulated_gpu("h100-80gb"):
        kept = torch.empty(2**20, device="cuda")  # 4 MiB in a 20 MiB segment, still in use
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        a = torch.empty(2**18, device="cuda")  # 1 MiB: a 2 MiB small-pool segment
        b = torch.empty(2**24, device="cuda")  # 64 MiB: its own segment
        del a, b
        reserved = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        released = reserved - torch.cuda.memory_reserved()
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        del kept
    trace = load_snapshot(path).device_trace(0)
    frees = [e for e in trace if e.action == "segment_free"]
    assert released == 66 << 20 and sorted(e.size for e in frees) == [2 << 20, 64 << 20]
    for free in frees:
        assert free.frames[0].name == "empty_cache" and free.frames[0].filename.endswith("memory.py")
        assert any(f.filename == HERE for f in free.frames)
    assert replay_snapshot(load_snapshot(path)).all_match
