"""VGG-19 demo: where memory goes while building, moving and training a model.

In the spirit of the classic MemTracker example: a stamp before and after building the
model, after moving it to the device, after a forward pass, after backward and after an
optimizer step. Uses CUDA when available, else the CPU (the report says which). On CUDA
the demo first measures the CUDA context once (``gpu_mem_track probe``: a subprocess, a few
seconds, cached per GPU), so the stamps split the framework cost; ``track()`` itself never
measures it.

    python -m gpu_mem_track.examples.vgg_demo [--device cpu] [--image-size 224] [--batch 2]

(``make demo`` runs it as ``scripts/tools/vgg_demo.py``; it ships in the package, so an
installed wheel runs it too.)
"""

from __future__ import annotations

import argparse

import torch

from gpu_mem_track import MemTracker
from gpu_mem_track.examples.models import load_vgg19
from gpu_mem_track.tracker.probe import ProbeError, cached_probe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument("--image-size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--batch", type=int, default=2, help="batch size (default 2)")
    parser.add_argument("--out-dir", default="reports", help="report folder (default reports/)")
    parser.add_argument("--run-name", default=None, help="report file name (default vgg_demo-<time>)")
    parser.add_argument("--totals-only", action="store_true", help="print totals, not tensor groups")
    args = parser.parse_args(argv)
    if args.image_size < 32 or args.batch < 1:
        parser.error("--image-size must be at least 32 and --batch at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        measure_context(f"cuda:{device.index or 0}")
    tracker = MemTracker(
        device=device, out_dir=args.out_dir, run_name=args.run_name, detail=not args.totals_only
    )
    tracker.track("before building the model")

    model, source = load_vgg19()
    print(f"model: {source}")
    tracker.watch(model)
    tracker.track("model built")

    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    tracker.watch(optimizer)
    tracker.track("model on device")

    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    tracker.track("forward")

    loss.backward()
    tracker.track("backward")

    optimizer.step()
    tracker.track("optimizer step")

    optimizer.zero_grad(set_to_none=True)
    del loss
    tracker.track("gradients released")
    if tracker.files is not None:
        print(f"reports: {tracker.files.log} and {tracker.files.csv}")
    return 0


def measure_context(device: str) -> None:
    """Measure (or read from the cache) the CUDA context cost before this process starts CUDA."""
    print(f"measuring the CUDA context on {device} once (a subprocess; cached for later runs)")
    try:
        cached_probe(device)
    except ProbeError as exc:
        print(f"no CUDA context probe ({exc}); the framework cost stays unsplit")


if __name__ == "__main__":
    raise SystemExit(main())
