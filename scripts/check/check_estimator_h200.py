"""Check ``estimate`` against the H200 recordings of timm's ViT-B/16 and ResNet-50.

``check_vit.py`` and ``check_resnet.py`` run the two training scripts under ``run
--simulate h200``; this check gives their models and steps to the estimator instead:
``estimate(Model, shape, step=step, optimizer=SGD, gpu="hopper")``, the step being the
scripts' loop body (``zero_grad()``, forward and cross-entropy loss under
``torch.autocast("cuda")`` in bfloat16 for the ViT and float16 for the ResNet,
``backward()`` inside it, SGD with momentum 0.9 and Nesterov), with TF32 matmuls and
``cudnn.benchmark`` on as the scripts set them. The estimate measures the second step
(one warm-up, ``cudnn.benchmark``'s trials in it), where both recordings peak; its peak
allocated and reserved are compared with the recording's ``max_memory_allocated()`` and
``max_memory_reserved()`` (``real/NAME.json`` in the H200 fixture folder: ``--fixtures``,
else ``shared/fixtures/h200`` beside the checkout or one level up).

``gpu="hopper"`` is a GPU of compute capability 9.0 with unbounded memory and the H100's
132 SMs (``simgpu.catalog.ARCHITECTURE_GPUS``), as many as the H200 that recorded; the SM
count sizes CUDA's reduction staging around sums split across thread blocks
(``gpumodel.reduce``). Each workload is also estimated with no SM count (the table
emptied), as the estimator ran before it took one: no staging. Writes
``reports/estimator_h200_check.md`` (``--out``) and a ``.json`` beside it.

    python scripts/check/check_estimator_h200.py [--fixtures DIR] [--out reports/estimator_h200_check.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the package, and scripts/_common

import torch  # noqa: E402
from _common.fixtures import h200_folder, shown  # noqa: E402
from resnet50_train import ResNet50  # noqa: E402
from torch import nn  # noqa: E402
from vit_train import VisionTransformer  # noqa: E402

from gpu_mem_track import estimate  # noqa: E402
from gpu_mem_track.simgpu import catalog  # noqa: E402

#: recording name: (model class, input shape, autocast dtype, the script it comes from)
WORKLOADS = {
    "timm-vit-b16-bf16": (VisionTransformer, (64, 3, 224, 224), torch.bfloat16, "vit_train.py"),
    "timm-resnet50-amp": (ResNet50, (128, 3, 288, 288), torch.float16, "resnet50_train.py"),
}


def training_step(dtype: torch.dtype) -> Callable[..., None]:
    """The scripts' loop body under ``torch.autocast("cuda", dtype)``."""
    loss_fn = nn.CrossEntropyLoss()

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: list[torch.Tensor]) -> None:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=dtype):
            output = model(*inputs)
            target = torch.empty(output.shape[0], device=output.device, dtype=torch.long).random_(1000)
            loss_fn(output, target).backward()
        optimizer.step()

    return step


def sgd(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1e-4, momentum=0.9, nesterov=True)


def estimated(name: str, sm_count: bool) -> dict:
    """The workload's estimate on ``gpu="hopper"``; without ``sm_count``, with no SM count."""
    model, shape, dtype, _ = WORKLOADS[name]
    table = catalog.ARCHITECTURE_GPUS if sm_count else {}
    start = time.perf_counter()
    with mock.patch.object(catalog, "ARCHITECTURE_GPUS", table):
        est = estimate(model, shape, step=training_step(dtype), optimizer=sgd, gpu="hopper", warmup=1)
    last = max(est.phases, key=lambda p: p.peak)
    return {
        "allocated": est.peak,
        "reserved": est.reserved_peak,
        "phase": last.phase,
        "op": last.op,
        "seconds": round(time.perf_counter() - start, 1),
    }


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def render(results: dict, fixtures: Path, command: str) -> str:
    lines = [
        "# The estimator against the H200 recordings",
        "",
        f"Commit {results['commit']}, {results['date']}, torch {torch.__version__}; written by `{command}`. "
        f"Recordings: `real/NAME.json` in `{shown(fixtures)}`. Estimated: each script's model and loop "
        "body (`scripts/check/vit_train.py`, `scripts/check/resnet50_train.py`), "
        "`estimate(Model, shape, step=step, optimizer=SGD, gpu='hopper', warmup=1)`: the second step, "
        "where both recordings peak.",
        "",
        "| recording | figure | recorded | estimated | difference | no SM count (no reduction staging) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, row in results["workloads"].items():
        for figure, key in (("peak allocated", "allocated"), ("peak reserved", "reserved")):
            rec, est, bare = row["recorded"][key], row["estimated"][key], row["no_sm_count"][key]
            lines.append(
                f"| {name} | {figure} | {rec:,} B | {est:,} B | {est / rec - 1:+.3%} "
                f"| {bare:,} B ({bare / rec - 1:+.3%}) |"
            )
    lines += [
        "",
        "Peaks: "
        + "; ".join(
            f"{name} in {row['estimated']['phase']} ({row['estimated']['op']}), estimated in "
            f"{row['estimated']['seconds']} s"
            for name, row in results["workloads"].items()
        )
        + ".",
        "",
        "`gpu='hopper'` has the H100's 132 SMs (`simgpu/catalog.py`, `ARCHITECTURE_GPUS`), as the H200 "
        "that recorded, so its sums split across thread blocks take CUDA's reduction staging "
        "(`gpumodel/reduce.py`): the ViT's bias gradients over 12,608 rows take 77,463,552 B, "
        "139,198,464 B and 138,412,032 B staging buffers, one at its peak. The last column is the "
        "estimate with no SM count, as the estimator ran before it took one (`run --simulate h200` "
        "had the staging already: `reports/vit_check.md`). The ResNet-50 has no such sum at its peak "
        "(its only bias is the head's, summed over 128 rows): the same figures both ways.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fixtures", type=Path, help="the H200 fixture folder (default: shared/fixtures/h200)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "reports/estimator_h200_check.md",
        help="the report (and .json beside it)",
    )
    args = parser.parse_args(argv)
    fixtures = h200_folder(args.fixtures, [f"real/{name}.json" for name in WORKLOADS])
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    results: dict = {
        "commit": commit(),
        "date": date.today().isoformat(),
        "torch": torch.__version__,
        "workloads": {},
    }
    for name in WORKLOADS:
        real = json.loads((fixtures / "real" / f"{name}.json").read_text())
        results["workloads"][name] = {
            "recorded": {"allocated": real["max_allocated"], "reserved": real["max_reserved"]},
            "estimated": estimated(name, sm_count=True),
            "no_sm_count": estimated(name, sm_count=False),
        }
    command = "PYTHONPATH=$PWD python scripts/check/check_estimator_h200.py"
    text = render(results, fixtures, command)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
