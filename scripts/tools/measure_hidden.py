"""How much of a forward pass's memory gc cannot see, and how much the recorder attributes.

For each workload (VGG-19 from ``gpu_mem_track.examples.models``, one ``nn.TransformerEncoderLayer``),
on the CPU, in training mode, after one warm-up step:

1. a forward pass (and loss) without the saved-tensor recorder, then one with it;
2. around each, the process heap in use (glibc ``mallinfo2``: ``uordblks + hblkhd``, i.e.
   bytes handed out by malloc, mmapped chunks included; torch's CPU allocator uses malloc)
   and a census of live tensors (``full_scan``: every gc-visible tensor, each storage once);
3. *left by forward* = heap growth over the pass; *visible* = census growth;
   *not visible* = left - visible. On CUDA the same bytes would be allocated but not
   accounted for by a visible tensor: "hidden" (plus block rounding, not modelled here).

The heap figure also counts non-tensor allocations (TensorImpl objects, autograd nodes,
the recorder's records): a few hundred bytes per tensor, reported as such.

    python scripts/tools/measure_hidden.py [--batch 2] [--image-size 224] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_mem_track.examples.models import vgg19  # noqa: E402
from gpu_mem_track.tracker.census import full_scan, take_census  # noqa: E402
from gpu_mem_track.tracker.saved import SavedTensorRecorder  # noqa: E402
from gpu_mem_track.units import format_bytes  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def heap_reader() -> Callable[[], int]:
    """Bytes the C heap has handed out and not taken back (glibc only)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2

    def read() -> int:
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return read


Step = Callable[[], tuple[torch.Tensor, torch.Tensor]]


def vgg_workload(batch: int, image_size: int) -> tuple[nn.Module, Step, list[tuple[str, Any]]]:
    torch.manual_seed(0)
    model = vgg19().train()
    images = torch.randn(batch, 3, image_size, image_size)
    labels = torch.randint(0, 1000, (batch,))

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        out = model(images)
        return out, F.cross_entropy(out, labels)

    return model, step, [("", model), ("images", images), ("labels", labels)]


def transformer_workload(batch: int, seq: int) -> tuple[nn.Module, Step, list[tuple[str, Any]]]:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True).train()
    x = torch.randn(batch, seq, 512)

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        out = model(x)
        return out, out.pow(2).mean()

    return model, step, [("", model), ("x", x)]


def measure(name: str, model: nn.Module, step: Step, roots: list[tuple[str, Any]]) -> dict[str, Any]:
    heap = heap_reader()
    out, loss = step()  # warm-up: lazily allocated library state, first-call caches
    loss.backward()
    model.zero_grad(set_to_none=True)
    del out, loss
    result: dict[str, Any] = {"workload": name}
    recorder = SavedTensorRecorder()
    recorder.watch(model)
    for recording in (False, True):
        gc.collect()
        heap_before, census_before = heap(), take_census("cpu", full_scan, roots, saved=recorder)
        if recording:
            with recorder:
                out, loss = step()
        else:
            out, loss = step()
        heap_after = heap()
        census_after = take_census("cpu", full_scan, roots, saved=recorder)
        left = heap_after - heap_before
        visible = census_after.nbytes - census_before.nbytes
        before_cats = census_before.categories.by_label()
        result["with recorder" if recording else "without recorder"] = {
            "left by forward": left,
            "visible": visible,
            "not visible": left - visible,
            "category growth": {
                k: v - before_cats[k]
                for k, v in census_after.categories.by_label().items()
                if v != before_cats[k]
            },
            "saved tensors recorded": len(recorder),
        }
        if recording:
            loss.backward()
            gc.collect()
            after_backward = take_census("cpu", full_scan, roots, saved=recorder)
            result["after backward: activation bytes"] = after_backward.categories.activation
            result["after backward: records left"] = len(recorder)
        del out, loss
        model.zero_grad(set_to_none=True)
    return result


def render(result: dict[str, Any]) -> str:
    lines = [f"## {result['workload']}", "", "| | without recorder | with recorder |", "|---|---|---|"]
    plain, recorded = result["without recorder"], result["with recorder"]
    for key in ("left by forward", "visible", "not visible"):
        lines.append(
            f"| {key} | {format_bytes(plain[key])} ({plain[key]:,} B) | "
            f"{format_bytes(recorded[key])} ({recorded[key]:,} B) |"
        )
    counts = (plain["saved tensors recorded"], recorded["saved tensors recorded"])
    lines.append(f"| saved tensors recorded | {counts[0]} | {counts[1]} |")
    for label in sorted(set(plain["category growth"]) | set(recorded["category growth"])):
        a, b = plain["category growth"].get(label, 0), recorded["category growth"].get(label, 0)
        lines.append(f"| growth: {label} | {format_bytes(a)} | {format_bytes(b)} |")
    lines.append("")
    lines.append(
        f"After backward: activation bytes {result['after backward: activation bytes']}, "
        f"records left {result['after backward: records left']}."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2, help="VGG-19 batch (default 2)")
    parser.add_argument("--image-size", type=int, default=224, help="VGG-19 image size (default 224)")
    parser.add_argument("--tf-batch", type=int, default=8, help="transformer batch (default 8)")
    parser.add_argument("--seq", type=int, default=128, help="transformer sequence length (default 128)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    results = [
        measure(
            f"VGG-19, batch {args.batch}, {args.image_size}x{args.image_size}",
            *vgg_workload(args.batch, args.image_size),
        ),
        measure(
            f"TransformerEncoderLayer(512, 8 heads), batch {args.tf_batch}, seq {args.seq}",
            *transformer_workload(args.tf_batch, args.seq),
        ),
    ]
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, CPU\n")
    for result in results:
        print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
