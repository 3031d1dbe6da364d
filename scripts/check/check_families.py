"""Check ``run --simulate`` on the two families issue 27 found over-estimated.

Runs each family's script (``scripts/check/lm_benchmark.py``: a cs336-style float32 LM
forward/backward loop, no optimizer, gradients accumulating; ``scripts/check/
hf_trainer_finetune.py``: a Hugging Face ``Trainer`` fine-tune of a Llama-style model, bf16,
fused AdamW) under ``python -m gpu_mem_track run --simulate GPU --run-to-end`` with this
checkout, and, with ``--before REV``, with the package as it was at git revision ``REV``
(exported to a temporary folder), and reads the ``max_memory_allocated`` and
``max_memory_reserved`` each script prints at its end. With ``--measure`` (a machine with
a CUDA GPU) each script also runs plainly and the simulated figures are compared with the
GPU's (targets: within 0.5% allocated, 1% reserved; exit code 1 when one is missed).

Writes ``reports/families_check.md`` and ``.json`` (``--out``): the figures, what changed
between the two versions and why, and what is still known to differ::

    python scripts/check/check_families.py [--before REV] [--gpu h200] [--measure]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FAMILIES = {
    "lm-benchmark": HERE / "lm_benchmark.py",
    "hf-trainer": HERE / "hf_trainer_finetune.py",
}
TARGETS = {"allocated": 0.005, "reserved": 0.01}
PRINTED = re.compile(r"^max_memory_(allocated|reserved) (\d+)$", re.MULTILINE)

CAUSES = [
    "Gradient sums in backward. Autograd's input buffer (torch/csrc/autograd/input_buffer.cpp, "
    "`accumulate`, `can_accumulate_inplace`) adds a second gradient into the first in place when "
    "the first is a plain dense tensor held only by the buffer, but `at::isTensorSubclassLike` is "
    "true for every tensor while a Python dispatch mode is on, and the simulation's storage "
    "tracker is one: every sum was `old + new`, one more gradient-sized block each (11 (batch, seq, "
    "d_model) blocks per layer of the recorded 2.7B step, 2 logits-sized at a hand-written loss). "
    "`gpu_mem_track/gpumodel/accumulate.py` now runs `add_` where CUDA would: the first operand's "
    "TensorImpl and storage reference counts (read from the TensorImpl, compared with those of a "
    "gradient known to be held alone, measured once per process) and its birth in an earlier "
    "autograd node (a node's own `a + b` stays out of place).",
    "Backward formulas with a subclass branch (torch/csrc/autograd/FunctionsManual.cpp: "
    "`value_selecting_reduction_backward` for max/min over a dim, `index_backward`, "
    "`gather_backward`, `index_select_backward`): zeros, then `scatter_`, `_index_put_impl_`, "
    "`scatter_add_` or `index_add_` into them on CUDA, the out-of-place op (a second input-sized "
    "block) under a mode. The same module runs the in-place op when its target is the zeros made "
    "by the op just before, in backward. The cs336-style loss (`logits.max(dim)`, `gather`) and "
    "the embedding looked up by indexing (a (vocab, d_model) block) take these paths.",
    "Grouped-query attention. Llama-style models with fewer key/value heads than query heads call "
    "`scaled_dot_product_attention(..., enable_gqa=True)`; CUDA's flash kernel (and cuDNN's) takes "
    "the grouped heads as they are (torch/csrc/.../sdp_utils.cpp: "
    "`check_batch_size_and_num_heads_dense<true /*supports GQA*/>`), but gpumodel.attention "
    "repeated the key and value heads first: two query-sized copies per layer, saved for backward. "
    "It now runs flash on the grouped heads (the math path, which repeats them, where the "
    "memory-efficient kernel would have been asked: that kernel refuses grouped heads).",
]
REMAINING = [
    "A node that sums two gradients it made itself (`y * y`: both of MulBackward0's outputs go to "
    "`y`) is summed out of place (one extra block): it cannot be told from a formula's own "
    "`a + b` of two temporaries by what the dispatch mode sees.",
    "The Trainer family's peak is in the loss's backward (the float32 log-softmax output saved, "
    "nll_loss's gradient and log-softmax's gradient: three float32 logits-sized blocks), where "
    "the two autograd rules do not apply; what moves it is the attention rule (the repeated "
    "key/value copies are live there). Flash's backward expands the key/value gradients inside "
    "the kernel (transient, not modelled). No GPU trace of either family exists here: run this "
    "check with `--measure` on a GPU to compare.",
    "Kernel scratch beyond reduction staging over leading dimensions, cuBLASLt's workspace and "
    "attention's (sorting, reductions along the fastest dimension) is not modelled: the GPU holds "
    "more there (gpu_mem_track/gpumodel/differences.py).",
]


def export(rev: str, into: Path) -> Path:
    """The checkout's files at git revision ``rev``, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def run(
    command: list[str], package: Path | None, cwd: Path, timeout: int
) -> tuple[dict[str, int], float, str]:
    """Run ``command`` with ``package`` first on ``PYTHONPATH``; the printed peaks, seconds and
    the output's tail."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = str(package) + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    seconds = time.perf_counter() - start
    figures = {kind: int(n) for kind, n in PRINTED.findall(done.stdout)}
    if done.returncode != 0 or len(figures) != 2:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{tail}")
    return figures, seconds, done.stdout[-500:]


def simulate(script: Path, gpu: str, package: Path, work: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--simulate", gpu, "--run-to-end"]
    command += ["--out-dir", str(work), str(script), *extra]
    figures, seconds, _ = run(command, package, work, 3600)
    return {**figures, "seconds": round(seconds, 1)}


def change(after: int, before: int) -> str:
    return f"{(after - before) / before:+.3%}"


def render(result: dict) -> str:
    lines = [
        "# `run --simulate` on the families issue 27 found over-estimated",
        "",
        f"Written by `{result['command']}` on {result['gpu']} (simulated; torch {result['torch']}). "
        "The scripts print `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` at "
        "their end; under the simulation these are the allocator model's.",
        "",
        "Measured on a real H200 (torch 2.11, cu130) by the issue's reporter, for their sizes: the "
        "simulation over the GPU by +2.3% allocated and reserved (the LM loop) and +1.6% allocated, "
        "+1.8% reserved (the Trainer). Those scripts and traces are not here; the two below are "
        "written to the same recipe.",
        "",
        "| family | script arguments | before: allocated, reserved | after: allocated, reserved "
        "| change | GPU (--measure) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, row in result["families"].items():
        after, before, gpu = row["after"], row.get("before"), row.get("gpu")
        before_cell = f"{before['allocated']:,}, {before['reserved']:,}" if before else "-"
        moved = "-"
        if before:
            moved = ", ".join(change(after[kind], before[kind]) for kind in ("allocated", "reserved"))
        gpu_cell = "-"
        if gpu:
            errors = ", ".join(change(after[kind], gpu[kind]) for kind in ("allocated", "reserved"))
            gpu_cell = f"{gpu['allocated']:,}, {gpu['reserved']:,} (simulated {errors})"
        args = " ".join(row["arguments"]) or "(defaults)"
        after_cell = f"{after['allocated']:,}, {after['reserved']:,}"
        lines.append(f"| {name} | `{args}` | {before_cell} | {after_cell} | {moved} | {gpu_cell} |")
    if result.get("before"):
        lines += ["", f"Before: the package at git revision `{result['before']}`; after: this checkout."]
    lines += ["", "## Causes found and modelled", ""] + [f"- {c}" for c in CAUSES]
    lines += ["", "## Still known to differ", ""] + [f"- {c}" for c in REMAINING]
    lines += [
        "",
        "Elsewhere the rules remove every allocation only the simulation made in the recorded 2.7B "
        "step's backward (`scripts/check/check_simulate.py`) and the sizes nanoGPT's backward made more "
        "often than the H200 did, two per configuration (`scripts/check/check_h200.py`).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="h200", help="the simulated GPU (a catalog name)")
    parser.add_argument("--before", metavar="REV", help="also simulate with the package at this git revision")
    parser.add_argument("--measure", action="store_true", help="also run each script on this machine's GPU")
    parser.add_argument("--only", choices=sorted(FAMILIES), action="append", help="check only this family")
    parser.add_argument("--lm-args", default="", help="arguments for lm_benchmark.py (one string)")
    parser.add_argument("--hf-args", default="", help="arguments for hf_trainer_finetune.py (one string)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "reports/families_check.md", help="report to write"
    )
    args = parser.parse_args(argv)
    if args.measure:
        import torch

        if not torch.cuda.is_available():
            parser.exit(2, "check_families: --measure needs a CUDA GPU\n")
    import torch

    extra = {"lm-benchmark": args.lm_args.split(), "hf-trainer": args.hf_args.split()}
    result: dict = {
        "command": "python scripts/check/check_families.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "gpu": args.gpu,
        "torch": torch.__version__,
        "before": args.before,
        "families": {},
    }
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            old = export(args.before, work / "before") if args.before else None
        except subprocess.CalledProcessError as exc:
            print(
                f"check_families: no git revision {args.before!r}: {exc.stderr.decode().strip()}",
                file=sys.stderr,
            )
            return 2
        for name in args.only or sorted(FAMILIES):
            script = FAMILIES[name]
            row: dict = {"script": str(script.relative_to(ROOT)), "arguments": extra[name]}
            row["after"] = simulate(script, args.gpu, ROOT, work, extra[name])
            if old is not None:
                row["before"] = simulate(script, args.gpu, old, work, extra[name])
            if args.measure:
                row["gpu"], _, _ = run([sys.executable, str(script), *extra[name]], None, work, 3600)
                for kind, target in TARGETS.items():
                    error = abs(row["after"][kind] - row["gpu"][kind]) / row["gpu"][kind]
                    failed |= error > target
            result["families"][name] = row
            print(f"{name}: {row}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(result), encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
