"""On a real GPU: how far a torch.compile'd training step's peak is from the eager one, and
from what ``run --simulate`` gives for it (which runs compiled regions as eager code:
``gpu_mem_track.simgpu.compiled``). The evidence issue 27's "a compiled script's peak
within 2% of the real one" needs before any model of Inductor's memory can be checked.

Writes a small training script (``examples.transformer`` or a GELU MLP, AdamW, a few
steps; ``--compile`` 0 or 1, ``--mode``), runs it in its own process per configuration
and reads the ``max_memory_allocated`` / ``max_memory_reserved`` it prints; then runs
the same script under ``python -m gpu_mem_track run --simulate GPU --run-to-end`` and
reads the run's peak and its ``simulation.compiled`` records. One JSON object per line in
``--out`` (default ``reports/gpu_check/<GPU>/compiled_peaks.jsonl``) and a table on stdout.

``--dry`` runs the simulated side only (no GPU needed), so the script and its file can be
checked here. Without ``--dry`` and without CUDA it exits 2.

    python scripts/check/compiled_peaks.py [--dry] [--gpu h200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = """
import argparse, json, torch
from torch import nn
from gpu_mem_track import examples

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="transformer")
parser.add_argument("--compile", type=int, default=0)
parser.add_argument("--mode", default="default")
args = parser.parse_args()
if args.model == "transformer":
    model = examples.transformer(d_model=512, heads=8, layers=4).cuda()
    x = torch.randn(16, 256, 512, device="cuda")
else:
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(2048, 2048), nn.GELU())]).cuda()
    x = torch.randn(1024, 2048, device="cuda")
optimizer = torch.optim.AdamW(model.parameters())
step_model = torch.compile(model, mode=args.mode) if args.compile else model
for step in range(4):
    loss = step_model(x).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
peaks = {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
print("PEAKS " + json.dumps(peaks))
"""

CONFIGS = [
    {"model": model, "compile": compiled, "mode": mode}
    for model in ("transformer", "mlp")
    for compiled, mode in ((0, "default"), (1, "default"), (1, "reduce-overhead"))
]


def _argv(config: dict) -> list[str]:
    return ["--model", config["model"], "--compile", str(config["compile"]), "--mode", config["mode"]]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def real(script: Path, config: dict) -> dict:
    """The script's own peaks on the GPU (bytes), or the error's last line."""
    done = subprocess.run(
        [sys.executable, str(script), *_argv(config)], capture_output=True, text=True, env=_env(), timeout=900
    )
    for line in done.stdout.splitlines():
        if line.startswith("PEAKS "):
            return json.loads(line[6:])
    return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}


def simulated(script: Path, config: dict, gpu: str, folder: Path) -> dict:
    """``run --simulate``'s peak allocated and reserved, and its compiled-region records."""
    name = f"{config['model']}-{config['compile']}-{config['mode']}"
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--simulate", gpu, "--run-to-end"]
    command += ["--out-dir", str(folder), "--run-name", name, str(script), *_argv(config)]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=folder, timeout=900)
    meta = folder / name / "meta.json"
    if not meta.exists():
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    data = json.loads(meta.read_text())
    return {
        "allocated": data.get("peak"),
        "reserved": data.get("reserved_peak"),
        "compiled": data.get("simulation", {}).get("compiled", []),
    }


def table(rows: list[dict]) -> list[str]:
    out = [f"{'model':12s} {'compile':8s} {'mode':16s} {'real alloc':>14s} {'simulated':>14s} {'error':>8s}"]
    for row in rows:
        got, want = row["simulated"].get("allocated"), row["real"].get("allocated") if row["real"] else None
        error = f"{got / want - 1:+.1%}" if got and want else "-"
        out.append(
            f"{row['model']:12s} {row['compile']!s:8s} {row['mode']:16s} {want or '-'!s:>14s} "
            f"{got or row['simulated'].get('error', '-')!s:>14s} {error:>8s}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="no GPU: the simulated side only")
    parser.add_argument("--gpu", default="h200", help="the simulated GPU (default h200)")
    parser.add_argument(
        "--out", type=Path, help="JSON lines (default reports/gpu_check/<GPU>/compiled_peaks.jsonl)"
    )
    args = parser.parse_args(argv)
    import torch

    if not args.dry and not torch.cuda.is_available():
        print("compiled_peaks.py needs a CUDA GPU (or --dry)", file=sys.stderr)
        return 2
    name = "dry" if args.dry else torch.cuda.get_device_name().replace(" ", "-")
    out = args.out or ROOT / "reports" / "gpu_check" / name / "compiled_peaks.jsonl"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "workload.py"
        script.write_text(textwrap.dedent(WORKLOAD).lstrip())
        for config in CONFIGS:
            row = {**config, "real": None if args.dry else real(script, config)}
            row["simulated"] = simulated(script, config, args.gpu, Path(tmp))
            rows.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print("\n".join([f"{name}, torch {torch.__version__}", *table(rows), f"written: {out}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
