"""Saved activations on CUDA: hidden memory shrinks by what the recorder attributes
(marked ``cuda``; skipped without a GPU), and the recorder on the simulated GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu_mem_track import MemTracker


def _model_and_tracker(tmp_path, device: str):
    """A dropout MLP on ``device`` after one warm-up step (cuBLAS workspaces and gradients
    exist), watched by a tracker that writes nothing. Every activation is 64 x 1024 float32
    = 256 KiB (the dropout mask 64 KiB): small-pool blocks, multiples of 512 B, so the
    allocator adds no slack."""
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Dropout(0.5), nn.Linear(1024, 1024))
    model = model.to(device).train()
    x = torch.randn(64, 1024, device=device)
    tracker = MemTracker(device=device, out_dir=tmp_path, verbosity=0, probe=False)
    tracker.watch(model, x=x)
    model(x).pow(2).mean().backward()
    return model, x, tracker


def _forward_twice(tracker, model, x):
    """Ledgers before and after a plain forward, then before and after the same forward
    under the saved-activation recorder; returns them and the recorded forward's loss."""
    base = tracker.track().ledger
    loss = model(x).pow(2).mean()
    plain = tracker.track().ledger
    del loss
    rebase = tracker.track().ledger
    with tracker.saved_activations():
        loss = model(x).pow(2).mean()
    return base, plain, rebase, tracker.track().ledger, loss


@pytest.mark.cuda
def test_hidden_shrinks_by_the_saved_bytes_gc_cannot_see(tmp_path):
    # Real GPU only: on the simulated GPU every tensor autograd saves has passed through a
    # Python dispatch mode, which gives it a Python object that gc sees, so nothing saved
    # is hidden there (see the next test).
    device = "cuda:0"
    torch.manual_seed(0)
    model, x, tracker = _model_and_tracker(tmp_path, device)
    base, plain, rebase, recorded, loss = _forward_twice(tracker, model, x)
    # The same forward leaves the same bytes allocated either way.
    assert recorded.allocated - rebase.allocated == plain.allocated - base.allocated
    # Without the recorder the dropout mask (C++ only) is hidden; with it, nothing is.
    assert plain.hidden - base.hidden >= 64 * 1024
    assert recorded.hidden - rebase.hidden == 0
    assert recorded.categories.activation >= plain.hidden - base.hidden
    assert sum(recorded.breakdown().values()) == recorded.total
    loss.backward()
    assert tracker.track().ledger.categories.activation == 0


def test_on_the_simulated_gpu_the_recorder_names_what_the_forward_saved(tmp_path, gpu):
    if gpu is None:
        pytest.skip("the simulated GPU's own behaviour")
    device = "cuda:0"
    model, x, tracker = _model_and_tracker(tmp_path, device)
    allocated_before = torch.cuda.memory_allocated()
    base, plain, rebase, recorded, loss = _forward_twice(tracker, model, x)
    # hidden: two cuBLAS workspaces of the A100's default 8,519,680 B, one per handle (the
    # forward's thread and autograd's backward thread), and cuBLASLt's own 1 MiB, taken once
    # by the forward's biased addmm (gpumodel.reduce.lt_workspace_bytes); nothing else
    assert base.hidden == 2 * 8_519_680 + 2**20 and base.allocated == allocated_before
    # The same bytes either way; with the recorder all the forward kept is activation but
    # the loss (one 512-byte block), and nothing is hidden.
    assert recorded.allocated - rebase.allocated == plain.allocated - base.allocated
    assert recorded.hidden == rebase.hidden == base.hidden
    assert recorded.categories.activation == recorded.allocated - rebase.allocated - 512 > 0
    assert sum(recorded.breakdown().values()) == recorded.total
    loss.backward()
    assert tracker.track().ledger.categories.activation == 0
