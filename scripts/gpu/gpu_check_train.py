"""A training loop over one of the package's example models, for gpu_check.py.

    python scripts/gpu/gpu_check_train.py MODEL [--batch N] [--iters N] [--device cuda]

MODEL is a factory of ``gpu_mem_track.examples`` (convnet, resnet, mlp, transformer, lstm),
fed random inputs of its ``EXAMPLE_INPUTS`` shape at batch N; each iteration is a forward
pass, ``out.float().square().mean()`` as the loss, backward and an Adam step, and prints
``iter I: loss L, time T ms`` as nanoGPT's train.py does (the time includes ``loss.item()``,
which waits for the GPU), so gpu_check.py reads both the same way.
"""

from __future__ import annotations

import argparse
import time

import torch

from gpu_mem_track import examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(examples.EXAMPLE_INPUTS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = getattr(examples, args.model)().to(args.device)
    optimizer = torch.optim.Adam(model.parameters())
    shape = (args.batch, *examples.EXAMPLE_INPUTS[args.model][1:])
    for step in range(args.iters):
        started = time.perf_counter()
        x = torch.randn(shape, device=args.device)
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        loss = out.float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        print(f"iter {step}: loss {value:.4f}, time {(time.perf_counter() - started) * 1000:.2f}ms")


if __name__ == "__main__":
    main()
