"""CUDA facts, checked byte for byte (marked ``cuda``; skipped without a GPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gpu_mem_track import MemTracker
from gpu_mem_track.units import cuda_block_bytes

MiB = 2**20


def tracker(tmp_path, **kwargs):
    return MemTracker(device="cuda:0", out_dir=tmp_path, verbosity=0, **kwargs)


def test_a_one_element_tensor_holds_a_512_byte_block(tmp_path, gpu):
    t = tracker(tmp_path, probe=False)
    torch.cuda.init()
    before = t.track()
    x = torch.empty(1, device="cuda:0")
    after = t.track()
    assert [(c.shape, c.count_delta, c.bytes_delta) for c in after.changes] == [((1,), 1, 512)]
    assert after.ledger.allocated - (before.ledger.allocated or 0) == 512
    assert after.ledger.reserved >= 2 * MiB
    del x


def test_vgg19_on_cuda_census_matches_the_allocator_byte_for_byte(tmp_path, gpu):
    from gpu_mem_track.examples.models import vgg19

    t = tracker(tmp_path, probe=False)
    torch.empty(1, device="cuda:0")  # start CUDA so the baseline is read
    before = t.track()
    model = vgg19().to("cuda:0")
    t.watch(model)
    after = t.track()
    params = list(model.parameters())
    raw = sum(p.numel() * p.element_size() for p in params)
    assert raw == 574_668_960
    rounded = sum(cuda_block_bytes(p.numel() * p.element_size()) for p in params)
    assert after.ledger.tensors - before.ledger.tensors == rounded
    # requested_bytes counts what tensors asked for: byte for byte the parameters.
    assert after.ledger.requested - before.ledger.requested == raw
    # allocated_bytes counts whole blocks: a large block is not split when its leftover is
    # 1 MiB or less, so each large parameter may carry up to 1 MiB of slack ("hidden").
    large = sum(1 for p in params if p.numel() * p.element_size() > MiB)
    slack = (after.ledger.allocated - before.ledger.allocated) - rounded
    assert 0 <= slack <= large * MiB


@pytest.mark.cuda
def test_ledger_parts_sum_to_the_driver_figure(tmp_path):
    pytest.importorskip("pynvml")
    from gpu_mem_track.tracker.probe import cached_probe

    t = tracker(tmp_path, probe=True)  # reads the probe's cache; track() never measures
    x = torch.randn(1024, 1024, device="cuda:0")
    (x @ x).sum().item()
    cached_probe("cuda:0", str(torch.cuda.get_device_properties(0).uuid))  # as `gpu_mem_track probe` does
    ledger = t.track().ledger
    assert ledger.driver is not None and ledger.driver_source in ("nvml process", "nvml device-wide")
    assert sum(ledger.parts().values()) == ledger.driver
    assert ledger.hidden >= 0 and ledger.cache >= 0 and ledger.framework > 0
    assert ledger.context is not None and 50 * MiB < ledger.context < 4096 * MiB
    del x


@pytest.mark.cuda
def test_probe_measures_the_context_on_this_gpu():
    pytest.importorskip("pynvml")
    from gpu_mem_track.tracker.probe import run_probe

    result = run_probe("cuda:0")
    assert [s.name for s in result.stages][0] == "before CUDA"
    assert result.context > 50 * MiB
    assert result.total >= result.context


@pytest.mark.slow
@pytest.mark.parametrize("device", [None, "cuda", "cuda:0"])
def test_tracking_never_initialises_cuda(device):
    """Runs with and without a GPU: the default device, "cuda" and "cuda:0" alike."""
    code = (
        "import torch\n"
        "from gpu_mem_track import MemTracker\n"
        f"t = MemTracker(device={device!r}, out_dir=None, verbosity=0)\n"
        "x = torch.zeros(3)\n"
        "t.track(); t.track()\n"
        "assert not torch.cuda.is_initialized(), 'the tracker initialised CUDA'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_ledger_reconciles_with_the_allocators_own_counters(tmp_path, gpu):
    """Tensors + hidden = allocated, + cache = reserved, each figure as
    ``torch.cuda.memory_stats`` gives it at the stamp, through two training steps with Adam."""
    t = tracker(tmp_path, probe=False)
    model = torch.nn.Sequential(
        torch.nn.Linear(1000, 3000), torch.nn.ReLU(), torch.nn.Linear(3000, 10)
    ).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(333, 1000, device="cuda")
    t.watch(model, optimizer=optimizer)
    stamps = []

    def stamp():
        ledger = t.track().ledger
        stats = torch.cuda.memory_stats()
        stamps.append(ledger)
        assert (ledger.allocated, ledger.requested, ledger.reserved, ledger.peak_allocated) == (
            stats["allocated_bytes.all.current"],
            stats["requested_bytes.all.current"],
            stats["reserved_bytes.all.current"],
            stats["allocated_bytes.all.peak"],
        )
        assert ledger.tensors + ledger.hidden == ledger.allocated
        assert ledger.allocated + ledger.cache == ledger.reserved
        assert sum(ledger.breakdown().values()) == ledger.total

    for _ in range(2):
        loss = model(x).square().mean()
        stamp()
        loss.backward()
        stamp()
        optimizer.step()
        optimizer.zero_grad()
        stamp()
    cats = stamps[-1].categories
    params = sum(cuda_block_bytes(p.numel() * 4) for p in model.parameters())
    assert stamps[1].categories.gradient == params
    # Adam (foreach, neither fused nor capturable): exp_avg and exp_avg_sq on the GPU, the
    # step counters on the CPU
    assert (cats.parameter, cats.optimizer_state, cats.gradient) == (params, 2 * params, 0)
