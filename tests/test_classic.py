"""The classic tool's README example runs against this package, and its helpers mean the same.

The example (Pytorch-Memory-Utils, README "Track the amount of GPU memory usage") is
rewritten only where this machine forces it: VGG-19's features come from
``gpu_mem_track.examples.models`` (torchvision does not import here, no download), the
device is CUDA when available else the CPU, and the tensors are 64x64 images instead of
512x512 to keep the test's memory small. Every MemTracker call is the example's own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gpu_mem_track import MemTracker

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20

EXAMPLE = textwrap.dedent(
    """\
    import torch

    from gpu_mem_track.examples.models import vgg19
    from gpu_mem_track import MemTracker

    device = torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')

    gpu_tracker = MemTracker()         # define a GPU tracker

    gpu_tracker.track()                     # run function between the code line where uses GPU
    cnn = vgg19().features.to(device).eval()
    gpu_tracker.track()                     # run function between the code line where uses GPU

    dummy_tensor_1 = torch.randn(30, 3, 64, 64).float().to(device)
    dummy_tensor_2 = torch.randn(40, 3, 64, 64).float().to(device)
    dummy_tensor_3 = torch.randn(60, 3, 64, 64).float().to(device)

    gpu_tracker.track()

    dummy_tensor_4 = torch.randn(120, 3, 64, 64).float().to(device)
    dummy_tensor_5 = torch.randn(80, 3, 64, 64).float().to(device)

    gpu_tracker.track()

    dummy_tensor_4 = dummy_tensor_4.cpu()
    dummy_tensor_2 = dummy_tensor_2.cpu()
    gpu_tracker.clear_cache() # or torch.cuda.empty_cache()

    gpu_tracker.track()
    print("usage", gpu_tracker.get_tensor_usage(), gpu_tracker.get_allocate_usage())
    gpu_tracker.print_all_gpu_tensor()
    """
)


def run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "main.py"
    script.write_text(code)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_classic_readme_example_runs_unchanged(tmp_path):
    done = run(EXAMPLE, tmp_path)
    assert done.returncode == 0, done.stderr
    stamps = [line for line in done.stdout.splitlines() if line.startswith("At main.py:")]
    # the classic README shows the same five lines: 10, 12, 18, 23, 29
    assert [int(s.split()[1][8:]) for s in stamps] == [10, 12, 18, 23, 29]
    image = 3 * 64 * 64 * 4
    usage = next(line for line in done.stdout.splitlines() if line.startswith("usage "))
    tensor_mib = float(usage.split()[1])
    # features' parameters (20,024,384 floats) and tensors 1, 3 and 5 stay on the device
    assert tensor_mib * MiB >= 20_024_384 * 4 + (30 + 60 + 80) * image
    assert f"Size:(80, 3, 64, 64) | float32 | {80 * image / MiB:.2f} MiB" in done.stdout
    assert "| Parameter | float32 | cnn.21.weight, cnn.23.weight, cnn.25.weight, ... (+4 more)" in done.stdout
    assert len(list((tmp_path / "reports").glob("main-*.csv"))) == 1


@pytest.mark.slow
def test_classic_frame_and_gpu_index_without_cuda_says_so_and_reports_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    code = (
        "import inspect, torch\n"
        "from gpu_mem_track import MemTracker\n"
        "frame = inspect.currentframe()\n"
        "gpu_tracker = MemTracker(frame, device=0)\n"
        "x = torch.zeros(1024, 1024)\n"
        "gpu_tracker.track()\n"
    )
    done = run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "CUDA is not available here" in done.stderr and "cuda:0 was asked for" in done.stderr
    stamp = done.stdout.splitlines()[0]
    assert " | cpu | tensors " in stamp and "cuda:0" not in stamp


def test_classic_helpers_mean_what_the_classic_ones_meant(quiet_tracker):
    tracker = quiet_tracker()
    before = tracker.get_tensor_usage()
    x = torch.zeros(256, 1024)  # 1 MiB
    view = x[:10]
    assert tracker.get_tensor_usage() - before == pytest.approx(1.0)  # the view adds nothing
    found = [t for t in tracker.get_tensors() if t is x or t is view]
    assert len(found) == 2
    assert tracker.get_allocate_usage() == 0.0  # no CUDA allocator on the CPU
    import io

    out = io.StringIO()
    tracker.print_all_gpu_tensor(file=out)
    assert "Size:(256, 1024) | float32 | 1.00 MiB" in out.getvalue().splitlines()
    assert "Size:(10, 1024) | float32 | 40.00 KiB" in out.getvalue().splitlines()
    del x, view, found


def test_clear_cache_is_never_called_by_track(quiet_tracker, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    tracker = quiet_tracker()
    tracker.track()
    assert calls == []
    tracker.clear_cache()
    assert calls == [1]
    assert isinstance(MemTracker.clear_cache.__doc__, str) and "never" in MemTracker.clear_cache.__doc__
