"""On a real GPU: which backend PyTorch picks for each convolution of a grid, and the
workspaces each allocates, next to what the model says (``gpumodel.convbackend`` for the
backend, ``gpumodel.cudnn`` for the workspaces), for the evidence the H200 ResNet-50 and
convnet recordings lack: depthwise and grouped convolutions, pointwise ones under cuDNN's
heuristics, float32/bfloat16/float16, NCHW and channels-last, ``cudnn.benchmark`` on and off.

For each case (batch, channels in and out, size, kernel, stride, groups, dtype, layout)
and each benchmark setting it records, in a fresh process state of the plan cache as far
as keys go (each case's shapes are its own):

- ``torch_backend``: ``torch._C._select_conv_backend`` (what PyTorch runs), and
  ``model_backend``: ``convbackend.select_backend`` for the device's compute capability;
- ``measured``: the sizes allocated and freed at once (a workspace, a trial, a kernel's
  scratch) in the first forward+backward (plans chosen, trials made) and the second,
  from the allocator's history; the backward gets a contiguous gradient of the output's
  layout, so no copy of an expanded gradient shows up;
- ``modelled``: the same lists as the model gives them (``convops.convolution_plan`` on
  meta tensors, ``cudnn.CudnnConvolutions.steps``).

Then two no_grad networks on a 1x16x320x320 float32 state (the issue's small depthwise
network, and an inverted residual block 16 -> 96 -> 16): their measured peak against
``estimate``'s, and ``estimate``'s with cuDNN off (no cuDNN workspace). One JSON object
per line in ``--out`` (default ``reports/gpu_check/<GPU>/conv_backends.jsonl``), and a
summary on stdout: backend mismatches, and per case the measured and modelled workspaces
where they differ.

``--dry`` needs no GPU: it writes the modelled side only (``measured`` and
``torch_backend`` null), for ``--capability`` (default 9.0), so the grid and the file can
be checked here before a GPU is lent. Without ``--dry`` and without CUDA it exits 2.

    python scripts/check/conv_backends.py [--dry] [--out FILE] [--capability 9.0] [--limit N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from gpu_mem_track.gpumodel.convops import CONVOLUTION_OPS, backend, convolution_plan  # noqa: E402
from gpu_mem_track.gpumodel.cudnn import CudnnConvolutions  # noqa: E402

_aten = torch.ops.aten
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STATE = (1, 16, 320, 320)


@dataclass(frozen=True)
class Case:
    """One convolution: ``groups`` is ``"1"``, ``"2"`` or ``"depthwise"`` (one per input
    channel); the output has ``cout`` channels; padding keeps the size at stride 1."""

    batch: int
    cin: int
    cout: int
    size: int
    kernel: int
    stride: int
    groups: str
    dtype: str
    channels_last: bool

    @property
    def group_count(self) -> int:
        return {"1": 1, "2": 2, "depthwise": self.cin}[self.groups]

    def geometry(self) -> tuple:
        """``aten.convolution``'s (stride, padding, dilation, transposed, output_padding, groups)."""
        pad = self.kernel // 2
        return ([self.stride] * 2, [pad] * 2, [1, 1], False, [0, 0], self.group_count)


def grid() -> list[Case]:
    """The cases: depthwise (channels 16, 32, 64, 256), pointwise and 3x3 dense and
    grouped ones, at a few sizes, batches, dtypes and both layouts."""
    cases = []
    shapes = [(1, 320), (8, 56), (32, 28), (1, 112)]
    for (batch, size), dtype, last in itertools.product(shapes, DTYPES, (False, True)):
        for cin in (16, 32, 64, 256):
            for kernel, stride in ((3, 1), (3, 2), (5, 1)):
                cases.append(Case(batch, cin, cin, size, kernel, stride, "depthwise", dtype, last))
        for cin, cout in ((16, 16), (96, 16), (16, 96), (64, 64)):
            cases.append(Case(batch, cin, cout, size, 1, 1, "1", dtype, last))
        cases.append(Case(batch, 32, 64, size, 3, 1, "1", dtype, last))
        cases.append(Case(batch, 32, 64, size, 3, 1, "2", dtype, last))
    return cases


def tensors(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The case's input and weight on ``device``, in its dtype and layout."""
    fmt = torch.channels_last if case.channels_last else torch.contiguous_format
    dtype = DTYPES[case.dtype]
    x = torch.randn(case.batch, case.cin, case.size, case.size, device=device, dtype=dtype)
    w = torch.randn(
        case.cout, case.cin // case.group_count, case.kernel, case.kernel, device=device, dtype=dtype
    )
    return x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)


def modelled(case: Case, benchmark: bool, capability: tuple[int, int]) -> dict:
    """The model's backend and the workspace/trial sizes of two forward+backward passes."""
    x, w = tensors(case, "meta")
    geometry = case.geometry()
    out = _aten.convolution.default(x, w, None, *geometry)
    grads = _aten.convolution_backward.default(out, x, w, None, *geometry, [True, True, False])
    cache, passes = CudnnConvolutions(), []
    backward_args = (out, x, w, None, *geometry, [True, True, False])
    for _ in range(2):
        sizes = []
        for func, args, result, in_backward in (
            (_aten.convolution.default, (x, w, None, *geometry), out, False),
            (_aten.convolution_backward.default, backward_args, grads, True),
        ):
            assert func in CONVOLUTION_OPS
            for _, problem in convolution_plan(func, args, result, in_backward, capability):
                steps = cache.steps(problem, benchmark)
                sizes += [s.nbytes for s in steps if s.action in ("trial", "workspace") and s.nbytes]
        passes.append(sizes)
    return {"model_backend": backend(x, w, geometry, capability), "modelled": passes}


def _transients(trace: list[dict]) -> list[int]:
    """Sizes allocated and freed before anything else is allocated or freed."""
    entries = [e for e in trace if e["action"] in ("alloc", "free_completed")]
    return [
        a["size"]
        for a, b in zip(entries, entries[1:])
        if a["action"] == "alloc" and b["action"] == "free_completed" and b["addr"] == a["addr"]
    ]


def measured(case: Case, benchmark: bool) -> dict:
    """PyTorch's backend and the transient allocations of two forward+backward passes (the
    first chooses the plans; the process must not have run this case's keys before)."""
    torch.backends.cudnn.benchmark = benchmark
    x, w = tensors(case, "cuda")
    geometry = case.geometry()
    picked = torch._C._select_conv_backend(x, w, None, *geometry)
    meta_x, meta_w = tensors(case, "meta")
    shape = _aten.convolution.default(meta_x, meta_w, None, *geometry).shape
    fmt = torch.channels_last if case.channels_last else torch.contiguous_format
    grad = torch.ones(shape, device="cuda", dtype=x.dtype).contiguous(memory_format=fmt)
    x.requires_grad_()
    w.requires_grad_()
    passes = []
    for _ in range(2):
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=100000)
        y = torch.nn.functional.conv2d(x, w, None, *geometry[:3], geometry[5])
        y.backward(grad)
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
        passes.append(_transients(trace))
        del y
        x.grad = w.grad = None
    return {"torch_backend": str(picked).rsplit(".", 1)[-1], "measured": passes}


def depthwise_net() -> nn.Module:
    """The issue's small network, as far as it describes it: depthwise 3x3 and pointwise
    blocks on a 16-channel state."""
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(), nn.Conv2d(16, 16, 1), nn.ReLU()]
    return nn.Sequential(*layers)


def inverted_residual() -> nn.Module:
    """A MobileNetV2 block without its residual: 1x1 16 -> 96, depthwise 3x3, 1x1 96 -> 16."""
    return nn.Sequential(
        nn.Conv2d(16, 96, 1),
        nn.ReLU6(),
        nn.Conv2d(96, 96, 3, padding=1, groups=96),
        nn.ReLU6(),
        nn.Conv2d(96, 16, 1),
    )


NETWORKS = {"depthwise_net": depthwise_net, "inverted_residual": inverted_residual}


def network_peaks(dry: bool, gpu: str) -> list[dict]:
    """Each network's no_grad forward on the state: ``estimate``'s peak on ``gpu``, the
    same with cuDNN off (``estimated_without_cudnn``: no cuDNN workspace, so the difference
    is the workspaces ``gpumodel.cudnn`` charges) and, on a GPU, the measured one (weights,
    input and activations, over what was allocated before)."""
    from gpu_mem_track import estimate

    torch.backends.cudnn.benchmark = False
    rows = []
    for name, factory in NETWORKS.items():
        with torch.backends.cudnn.flags(enabled=False):
            without = estimate(factory(), STATE, training=False, gpu=gpu).peak
        row = {
            "network": name,
            "state": list(STATE),
            "estimated": estimate(factory(), STATE, training=False, gpu=gpu).peak,
            "estimated_without_cudnn": without,
        }
        if not dry:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            model = factory().cuda().eval()
            x = torch.randn(STATE, device="cuda")
            with torch.no_grad():
                model(x)
            torch.cuda.synchronize()
            row["measured"] = torch.cuda.max_memory_allocated() - base
            del model, x
        rows.append(row)
    return rows


def run_cases(benchmark: bool, dry: bool, capability: tuple[int, int], limit: int | None) -> list[dict]:
    """One record per case of :func:`grid` (the first ``limit``) at this benchmark setting."""
    rows = []
    for case in grid()[:limit]:
        row = {"case": asdict(case), "benchmark": benchmark, "torch_backend": None, "measured": None}
        row.update(modelled(case, benchmark, capability))
        if not dry:
            row.update(measured(case, benchmark))
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Lines on what disagrees: backends, then workspaces (second pass and first)."""
    out = []
    for row in rows:
        if "network" in row:
            error = f" ({row['estimated'] / row['measured'] - 1:+.1%})" if row.get("measured") else ""
            out.append(
                f"{row['network']}: estimated {row['estimated']:,} B (without cuDNN's workspaces "
                f"{row['estimated_without_cudnn']:,} B), measured {row.get('measured')}{error}"
            )
            continue
        if row["torch_backend"] is not None and row["torch_backend"] != row["model_backend"]:
            out.append(f"backend: {row['case']} torch {row['torch_backend']}, model {row['model_backend']}")
        if row["measured"] is not None and row["measured"] != row["modelled"]:
            out.append(
                f"workspaces: {row['case']} benchmark={row['benchmark']}: measured {row['measured']}, "
                f"modelled {row['modelled']}"
            )
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="no GPU: write the modelled side only")
    parser.add_argument(
        "--out", type=Path, help="JSON lines file (default reports/gpu_check/<GPU>/conv_backends.jsonl)"
    )
    parser.add_argument("--capability", default="9.0", help="compute capability for --dry (default 9.0)")
    parser.add_argument("--gpu", default="h200", help="simulated GPU estimate uses (default h200)")
    parser.add_argument("--limit", type=int, help="only the first N cases of the grid")
    parser.add_argument(
        "--benchmark", choices=("on", "off"), help="one setting in this process (default: each in its own)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.dry and not torch.cuda.is_available():
        print("conv_backends.py needs a CUDA GPU (or --dry)", file=sys.stderr)
        return 2
    if args.dry:
        capability = tuple(int(p) for p in args.capability.split("."))
        name = f"dry-sm{capability[0]}{capability[1]}"
    else:
        capability, name = torch.cuda.get_device_capability(), torch.cuda.get_device_name().replace(" ", "-")
    out = args.out or ROOT / "reports" / "gpu_check" / name / "conv_backends.jsonl"
    settings = [args.benchmark == "on"] if args.benchmark else [False, True]
    rows = []
    for benchmark in settings:
        if args.benchmark or args.dry:
            rows += run_cases(benchmark, args.dry, capability, args.limit)
        else:  # a process of its own: cuDNN's plan cache keys leave benchmark out
            rows += _in_subprocess(benchmark, args)
    if not args.benchmark or args.benchmark == "off":
        rows += network_peaks(args.dry, args.gpu)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    header = (
        "dry run (model only)"
        if args.dry
        else f"{name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    )
    print("\n".join([header, f"{len(rows)} records in {out}", *summary(rows)]))
    return 0


def _in_subprocess(benchmark: bool, args: argparse.Namespace) -> list[dict]:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        part = Path(folder) / "part.jsonl"
        command = [sys.executable, __file__, "--benchmark", "on" if benchmark else "off", "--out", str(part)]
        command += ["--gpu", args.gpu] + (["--limit", str(args.limit)] if args.limit else [])
        subprocess.run(command, check=True)
        rows = [json.loads(line) for line in part.read_text().splitlines()]
    return [row for row in rows if "network" not in row] if benchmark else rows


if __name__ == "__main__":
    sys.exit(main())
