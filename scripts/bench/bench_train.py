"""The runner benchmark's workload: a few hundred CPU training steps of a small MLP.

Run plain, under ``python -m gpu_mem_track run`` and under ``python -m memory_profiler``
by ``scripts/bench/bench_runner.py``. ``@profile`` is memory_profiler's marker; it is a no-op
when the script runs any other way. Usage: ``bench_train.py [steps] [device]``.
"""

import sys
import time

import torch
from torch import nn

try:
    profile  # noqa: B018  (memory_profiler puts it in builtins)
except NameError:

    def profile(func):
        return func


@profile
def train(steps: int, device: str) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(steps % 7 + 64, 256, device=device)
    targets = torch.randint(0, 10, (inputs.shape[0],), device=device)
    total = 0.0
    for step in range(steps):
        batch = inputs + 0.01 * step
        optimizer.zero_grad(set_to_none=True)
        logits = model(batch)
        loss = nn.functional.cross_entropy(logits, targets)
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            total += loss.item()
        del logits, loss
    return total


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    torch.set_num_threads(1)
    started = time.perf_counter()
    total = train(steps, device)
    print(f"loss sum {total:.4f}")
    print(f"train seconds {time.perf_counter() - started:.6f}")
