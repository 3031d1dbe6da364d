"""Check the distributed estimator against real ranks; writes reports/estimator_dist.md and .json.

Launches ``python -m torch.distributed.run --standalone --nproc-per-node N`` (gloo, CPU,
``OMP_NUM_THREADS=1``) for N in 2 and 4; each rank runs every case's training step
(Adam, the third step measured) under DDP, ZeRO-1 (DDP + ZeroRedundancyOptimizer) or
FSDP2 and measures its peak with the storage tracking the single-process check uses
(``estimator.rank_step``: ``Lifetimes`` and ``run_steps``), with the kernels the
estimator simulates (math attention, oneDNN off). The estimator (CPU target, exact
sizes) gives each rank's peak for the same options.

    python scripts/check/check_estimator_dist.py            # all world sizes and cases
    python scripts/check/check_estimator_dist.py --world-sizes 2 --cases mlp:ddp
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {"convnet": (16, 3, 32, 32), "mlp": (64, 784), "transformer": (8, 64, 128)}
#: case name -> estimator / real-run options
STRATEGIES = {
    "ddp": dict(strategy="ddp"),
    "ddp-view": dict(strategy="ddp", gradient_as_bucket_view=True),
    "zero1": dict(strategy="zero1"),
    "fsdp": dict(strategy="fsdp"),
    "fsdp-keep": dict(strategy="fsdp", reshard_after_forward=False),
}
CASES = [f"{m}:{s}" for m in SHAPES for s in STRATEGIES]


def worker(cases: list[str], out: Path) -> None:
    """One rank: measure every case, write ``rank<k>.json`` into ``out``."""
    import torch
    import torch.distributed as dist
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpu_mem_track import examples
    from gpu_mem_track.estimator.options import DistOptions
    from gpu_mem_track.estimator.rank_step import measure_rank_step

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = {}
    for case in cases:
        model, strategy = case.split(":")
        options = DistOptions.parse(world_size=size, **STRATEGIES[strategy])
        with sdpa_kernel(SDPBackend.MATH), torch.backends.mkldnn.flags(enabled=False):
            rows[case] = measure_rank_step(getattr(examples, model), SHAPES[model], options)
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def launch(size: int, cases: list[str], out: Path) -> list[dict]:
    """Run the workers on ``size`` ranks; each rank's rows."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={size}"]
    command += [__file__, "--worker", str(out), "--cases", *cases]
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]


def compare(size: int, cases: list[str]) -> list[dict]:
    from gpu_mem_track import estimate, examples

    with tempfile.TemporaryDirectory() as tmp:
        measured = launch(size, cases, Path(tmp))
    rows = []
    for case in cases:
        model, strategy = case.split(":")
        est = estimate(
            getattr(examples, model), SHAPES[model], device="cpu", world_size=size, **STRATEGIES[strategy]
        )
        for rank, per_rank in enumerate(measured):
            real = per_rank[case]["peak"]
            predicted = est.ranks[rank].peak
            rows.append(dict(case=case, world_size=size, rank=rank, estimated=predicted, measured=real))
    return rows


def render(meta: dict, rows: list[dict]) -> str:
    lines = [
        "# Distributed estimator check",
        "",
        f"Commit {meta['commit']}, {meta['date']}, torch {meta['torch']}; written by `{meta['command']}`.",
        "",
        "Each rank's peak live CPU bytes during the third training step (Adam, foreach off),",
        "real ranks under torchrun with gloo (measured by storage lifetimes, math attention and",
        "oneDNN off) against the estimator's CPU target (exact sizes) for the same rank.",
        "Inputs: " + ", ".join(f"{m} {'x'.join(map(str, s))}" for m, s in SHAPES.items()) + " (per rank).",
        "",
        *_summary(rows),
        "",
        "Every rank:",
        "",
        "| case | ranks | rank | estimated | measured | difference |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        diff = r["estimated"] - r["measured"]
        lines.append(
            f"| {r['case']} | {r['world_size']} | {r['rank']} | {r['estimated']:,} | {r['measured']:,} "
            f"| {diff:+,} B ({diff / r['measured']:+.2%}) |"
        )
    return "\n".join(lines) + "\n" + NOTES


NOTES = """
## Where and why it differs

- **DDP** (default and `gradient_as_bucket_view`) and **ZeRO-1** (DDP with
  `ZeroRedundancyOptimizer`): equal to the byte on every rank. The estimator adds DDP's
  rebuilt buckets (one flat tensor per bucket, kept) and, for ZeRO-1, steps only the
  rank's partition in ZeroRedundancyOptimizer's order (largest first); stepping them in
  model order instead was 2,048 B over on rank 1 of the MLP (Adam's scratch of a
  different parameter at the peak).
- **FSDP2**: on all but three of the 36 rank rows, under by exactly the size of the model's
  last parameter, unsharded (40 B: the 10-float output bias of the convnet and the MLP;
  512 B: the transformer's last 128-float LayerNorm bias), on 2 and 4 ranks alike and with
  or without `reshard_after_forward`: a tensor FSDP2 keeps alive through the whole step
  that the estimator does not model; where FSDP2 holds it was not traced. The small host
  tensors of the DeviceMesh (one int32 rank tensor per non-root unit, 4 B per rank) are
  modelled on the CPU target.
- **FSDP2, some ranks of some runs** (in this run: convnet:fsdp rank 1 of 2 and
  convnet:fsdp-keep rank 3 of 4, 1,309,736 B; mlp:fsdp rank 1 of 2, 375,848 B): the
  measured peak is higher. This is timing, not the model: the same case is 40 B off on the
  other ranks, and which rank and case it hits changes from run to run (an earlier run hit
  convnet:fsdp rank 0 instead). Gloo runs collectives on its own thread; the copy its
  reduce-scatter makes of its input is usually freed as soon as the call returns, but when
  the work finishes late it lives on (seen in an event trace: a 10,280 B copy of the last
  MLP layer's reduce-scatter input held until the next unit's all-gather), which can raise
  the peak. The estimator frees it at once.
- The estimator models FSDP2's event order as measured: a forward all-gather buffer is
  freed after the next unit's copy-out (the root's post-forward frees the last); in
  backward right after the copy-out; backward prefetches the previous unit's all-gather;
  after a unit's backward its gradients are copied into a reduce-scatter input (one kept
  until the next unit's reduce), the sharded gradients are views of a padded
  reduce-scatter output. FSDP2 frees unsharded parameters by resizing their storages,
  which no dispatch mode sees: the real runs wrap FSDP2's `free_storage`/`alloc_storage`
  to tell the tracker, and the tracker counts a DTensor's local tensor, not its wrapper.
- On a GPU (NCCL, streams, the caching allocator) the timing and the buffers differ; no
  GPU has checked the distributed estimates yet.
"""


def _summary(rows: list[dict]) -> list[str]:
    """Per case and world size: ranks equal to the byte, and the largest difference."""
    lines = ["| case | ranks | equal to the byte | largest difference (B) |", "|---|---:|---:|---:|"]
    groups: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        groups.setdefault((r["case"], r["world_size"]), []).append(r["estimated"] - r["measured"])
    for (case, size), diffs in groups.items():
        equal = sum(d == 0 for d in diffs)
        lines.append(f"| {case} | {size} | {equal} of {len(diffs)} | {max(diffs, key=abs):+,} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cases", nargs="+", default=CASES)
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--render-only", action="store_true", help="re-render the .md from the .json")
    args = parser.parse_args()
    if args.worker:
        worker(args.cases, args.worker)
        return
    if args.render_only:
        data = json.loads((ROOT / "reports" / "estimator_dist.json").read_text())
        (ROOT / "reports" / "estimator_dist.md").write_text(render(data, data["rows"]))
        return
    import torch

    warnings.simplefilter("ignore")
    rows = [row for size in args.world_sizes for row in compare(size, args.cases)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    meta = {
        "commit": commit.stdout.strip() or "unknown",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "command": "python scripts/check/check_estimator_dist.py " + " ".join(sys.argv[1:]),
    }
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    (out / "estimator_dist.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    (out / "estimator_dist.md").write_text(render(meta, rows))
    print(render(meta, rows))


if __name__ == "__main__":
    main()
