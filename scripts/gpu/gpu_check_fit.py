"""gpu_check's fit step: the advisor's suggested change, run for real on this GPU.

1. ``python -m gpu_mem_track fit --batch-arg=--batch_size --json FIT_GPU train.py ARGS``:
   the advisor on nanoGPT's GPT-2 124M at batch 32 (:data:`ARGS`) for a simulated GPU
   smaller than this one (:data:`FIT_GPU`, an RTX 4090: 24 GB). It runs on the CPU, beside
   the other simulated parts.
2. On this GPU, each run capped by ``torch.cuda.set_per_process_memory_fraction`` at the
   simulated GPU's capacity (the bytes its allocator may reserve, over this GPU's
   ``total_memory``; a small wrapper sets it, then runs ``train.py`` as ``python`` would):
   the script as it is, the recommended change (its levers through ``run --device cuda
   --lever ...``, the batch argument as given), and, when the advisor found one, that
   row's largest batch and that batch plus one. Each real run's exit, out-of-memory error
   and ``max_memory_reserved`` are set against what the advisor said of it.

Without a GPU (``--dry``) only step 1 runs. Every part is time-boxed by ``Check``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_check_steps import Check, python, read_json

#: The simulated GPU the advisor is asked about: smaller than any GPU lent here.
FIT_GPU = "RTX-4090"
#: nanoGPT's GPT-2 124M at batch 32 (it runs out on a 24 GB GPU), short: 4 micro-steps, 3 iterations.
ARGS = [
    "--compile=False", "--eval_iters=2", "--eval_interval=1000", "--log_interval=1",
    "--gradient_accumulation_steps=4", "--max_iters=3", "--batch_size=32",
]  # fmt: skip
#: Sets the memory fraction, then runs the script as ``python SCRIPT ARGS`` would, and
#: writes max_memory_reserved and whether it ran out to the JSON path given first.
CAPPED = """
import json, os, runpy, sys, traceback, torch
out, fraction, script, args = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
torch.cuda.set_per_process_memory_fraction(fraction, 0)
sys.argv, sys.path[0] = [script, *args], os.path.dirname(os.path.abspath(script))
result = {"out_of_memory": False, "exit_code": 0}
try:
    runpy.run_path(script, run_name="__main__")
except torch.OutOfMemoryError:
    traceback.print_exc()
    result.update(out_of_memory=True, exit_code=1)
except SystemExit as exc:
    result["exit_code"] = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
result["max_memory_reserved"] = torch.cuda.max_memory_reserved(0)
result["max_memory_allocated"] = torch.cuda.max_memory_allocated(0)
with open(out, "w") as stream:
    json.dump(result, stream)
sys.exit(result["exit_code"])
"""


def advise(check: Check, nanogpt: Path, until: float) -> dict[str, Any] | None:
    """Step 1: the advisor's answer (``FitResult.to_dict()``), kept as ``fit.answer``."""
    argv = [python(), "-m", "gpu_mem_track", "fit", "--batch-arg=--batch_size", "--json"]
    argv += ["--out-dir", str(check.tmp / "fit"), FIT_GPU, "train.py", *ARGS]
    outcome = check.run("fit (simulated)", argv, nanogpt, 240, until)
    start = 0 if outcome.output.startswith("{") else outcome.output.rfind("\n{") + 1  # after the progress
    try:
        answer = json.loads(outcome.output[start:]) if outcome.rc in (0, 1) and start >= 0 else None
    except ValueError:
        answer = None
    if answer is None:
        check.note("fit", f"the advisor {outcome.status}{outcome.why}")
        return None
    check.put("fit", "answer", answer)
    return answer


def real_runs(check: Check, nanogpt: Path, answer: dict[str, Any], total_memory: int, until: float) -> None:
    """Step 2: the advisor's claims checked on this GPU, kept as ``fit.real`` rows."""
    fraction = answer["capacity"] / total_memory
    check.put("fit", "fraction", round(fraction, 6))
    wrapper = check.tmp / "capped.py"
    wrapper.write_text(CAPPED)
    rows = [row for row in answer["rows"] if row["label"] == "as it is"]
    rows += [row for row in answer["rows"] if row["label"] == answer.get("recommended") and row not in rows]
    cases: list[tuple[dict[str, Any], int | None, str, int | None]] = []
    for row in rows:
        cases.append((row, None, row["fits"], row["reserved_peak"]))
        best = row.get("batch")
        if best and best["batch"] > 0:
            cases += [
                (row, best["batch"], "yes", best["reserved_peak"]),
                (row, best["batch"] + 1, "no", None),
            ]
    real: list[dict[str, Any]] = []
    for index, (row, batch, said, reserved) in enumerate(cases):
        args = ARGS if batch is None else [a for a in ARGS if not a.startswith("--batch_size=")]
        args = args + ([] if batch is None else [f"--batch_size={batch}"])
        figures = check.tmp / f"fit-real-{index}.json"
        levers = [f"--lever={name}" for name in row["levers"]]
        argv = [python(), "-m", "gpu_mem_track", "run", "--device", "cuda", *levers]
        argv += ["--out-dir", str(check.tmp / "fit-real"), str(wrapper), str(figures), f"{fraction:.6f}"]
        label = f"fit real: {row['label']}" + ("" if batch is None else f" batch {batch}")
        outcome = check.run(label, [*argv, "train.py", *args], nanogpt, 120, until)
        got = read_json(figures) or {}
        ran_out = bool(got.get("out_of_memory"))
        real.append(
            {
                "row": row["label"],
                "batch": batch,
                "advisor_fits": said,
                "advisor_reserved": reserved,
                "real_out_of_memory": ran_out if got else None,
                "real_reserved": got.get("max_memory_reserved"),
                "status": outcome.status,
                "agrees": bool(got) and (ran_out == (said == "no")),
            }
        )
    check.put("fit", "real", real)


def render(fit: dict[str, Any]) -> str:
    """The report's fit section (``""`` when the step did not run)."""
    answer = fit.get("answer")
    if not answer:
        return "\n".join(["", "## Fit", "", *(f"- {note}" for note in fit.get("notes", ["not run"]))])
    mib = 2**20
    out = [
        "",
        "## Fit: the advisor's change, run for real",
        "",
        f"`fit --batch-arg=--batch_size {FIT_GPU} train.py {' '.join(ARGS)}` (nanoGPT GPT-2 124M): "
        f"{answer['verdict']}, recommended {answer.get('recommended') or '-'}, {answer['trials']} trials in "
        f"{answer['seconds']:.0f} s. On this GPU each run below was capped at the simulated capacity "
        f"({answer['capacity'] / mib:,.0f} MiB; memory fraction {fit.get('fraction', '-')}).",
        "",
    ]
    real = fit.get("real")
    if not real:
        out.append("Real runs: not run (dry mode, or out of time).")
        return "\n".join(out)
    out += [
        "| row | batch | advisor: fits | advisor: reserved MiB | GPU: out of memory | GPU: max reserved MiB "
        "| agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in real:
        said = "-" if r["advisor_reserved"] is None else f"{r['advisor_reserved'] / mib:,.1f}"
        got = "-" if r["real_reserved"] is None else f"{r['real_reserved'] / mib:,.1f}"
        ran_out = {True: "yes", False: "no", None: r["status"]}[r["real_out_of_memory"]]
        out.append(
            f"| {r['row']} | {r['batch'] or 'as given'} | {r['advisor_fits']} | {said} | {ran_out} | {got} | "
            f"{'yes' if r['agrees'] else '**no**'} |"
        )
    return "\n".join(out)
