"""The GPU check's fit part: the advisor on nanoGPT (simulated), then its edge claims on this GPU.

1. ``python -m gpu_mem_track fit --batch-arg=--batch_size --json FIT_GPU train.py ARGS``:
   the advisor on nanoGPT's GPT-2 124M at batch 32 (:data:`ARGS`) for a simulated GPU
   smaller than any lent here (:data:`FIT_GPU`, an RTX 4090: 24 GB). It runs on the CPU,
   beside the memory part, also in dry mode. Its answer is kept as ``fit.answer`` and
   written to ``claims.json`` with the script, its folder and its arguments.
2. The edge claims, on this GPU: scripts/gpu/gpu_check_edge.py (the advisor's largest
   batch and the next one, each run capped by ``set_per_process_memory_fraction`` at the
   simulated GPU's capacity). It is called in a subprocess (this process never holds a
   CUDA context) through :data:`EDGE_CALL`: ``check_edge`` of the claims' script, arguments,
   GPU and batch argument, at the batch the advisor gave the script as it is, returning a
   JSON-able record, kept as ``edge.record``. Skipped, with the reason, when
   that file is not in this checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

import gpu_check_report as report
from gpu_check_clock import ROOT, Check, python, read_json

#: The simulated GPU the advisor is asked about: smaller than any GPU lent here.
FIT_GPU = "RTX-4090"
SCRIPT = "train.py"
#: nanoGPT's GPT-2 124M at batch 32 (it runs out on a 24 GB GPU), short: 4 micro-steps, 3 iterations.
ARGS = [
    "--compile=False", "--eval_iters=2", "--eval_interval=1000", "--log_interval=1",
    "--gradient_accumulation_steps=4", "--max_iters=3", "--batch_size=32",
]  # fmt: skip
BATCH_ARG = "--batch_size"
EDGE = ROOT / "scripts" / "gpu" / "gpu_check_edge.py"
#: How the edge module is called (argv: its folder, claims.json, the output folder, "dry"
#: or "gpu"); the record it returns is printed as one JSON line after ``EDGE``.
EDGE_CALL = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import gpu_check_edge
claims = json.loads(Path(sys.argv[2]).read_text())
row = next((r for r in claims["answer"].get("rows", []) if r.get("label") == "as it is"), {})
batch = (row.get("batch") or {}).get("batch")
record = gpu_check_edge.check_edge(
    Path(claims["cwd"]) / claims["script"], claims["args"], gpu=claims["gpu"],
    batch_arg=claims["batch_arg"], out=Path(sys.argv[3]) / "record.json", batch=batch,
    dry=sys.argv[4] == "dry",
)
print("EDGE" + json.dumps(record, default=str))
"""


def command() -> str:
    """The advisor's command line, as the report shows it."""
    return f"gpu-mem-track fit --batch-arg={BATCH_ARG} {FIT_GPU} {SCRIPT} {' '.join(ARGS)}"


def advise(check: Check, nanogpt: Path, until: float) -> Path | None:
    """Step 1: the advisor's answer (``FitResult.to_dict()``) as ``fit.answer``, and the
    claims file for step 2 (``None`` when the advisor gave no answer)."""
    check.put("fit", "command", command())
    argv = [python(), "-m", "gpu_mem_track", "fit", f"--batch-arg={BATCH_ARG}", "--json"]
    argv += ["--out-dir", str(check.tmp / "fit"), FIT_GPU, SCRIPT, *ARGS]
    outcome = check.run("fit (simulated)", argv, nanogpt, 300, until)
    answer = report.last_json(outcome.output) if outcome.rc in (0, 1) else None
    if not isinstance(answer, dict) or "rows" not in answer:
        check.note("fit", f"the advisor {outcome.status}{outcome.why}")
        return None
    check.put("fit", "answer", answer)
    claims = check.tmp / "claims.json"
    claims.write_text(
        json.dumps(
            {
                "gpu": FIT_GPU,
                "cwd": str(nanogpt),
                "script": SCRIPT,
                "args": ARGS,
                "batch_arg": BATCH_ARG,
                "answer": answer,
            },
            indent=1,
        )
    )
    return claims


def edge(check: Check, claims: Path, dry: bool, until: float) -> None:
    """Step 2: the edge claims through scripts/gpu/gpu_check_edge.py, its record as
    ``edge.record`` (its output folder's files go with the runs' log)."""
    if not EDGE.is_file():
        check.skip("fit edge claims", f"{EDGE.relative_to(ROOT)} is not in this checkout")
        check.note("edge", f"skipped: {EDGE.relative_to(ROOT)} is not in this checkout")
        return
    out = check.tmp / "edge"
    out.mkdir(exist_ok=True)
    argv = [python(), "-c", EDGE_CALL, str(EDGE.parent), str(claims), str(out), "dry" if dry else "gpu"]
    outcome = check.run("fit edge claims", argv, ROOT, 300, until, gpu=not dry)
    found = [line[4:] for line in outcome.output.splitlines() if line.startswith("EDGE")]
    try:
        record = json.loads(found[-1]) if found else None
    except ValueError:
        record = None
    if record is None:
        record = read_json(out / "record.json")
    if record is not None:
        check.put("edge", "record", record)
    if not outcome.ok or record is None:
        check.note("edge", f"gpu_check_edge {outcome.status}{outcome.why}")


def run(check: Check, nanogpt: Path, dry: bool, until: float) -> None:
    """Both steps, one after the other (the edge claims need the advisor's answer)."""
    claims = advise(check, nanogpt, until)
    if claims is not None:
        edge(check, claims, dry, until)
    else:
        check.note("edge", "not run: the advisor gave no answer")
