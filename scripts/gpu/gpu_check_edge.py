"""The advisor's edge claims run for real: the largest batch ``fit`` says fits on a
simulated GPU, and the one after it (which it says runs out), each run plainly on this
GPU capped so that its caching allocator gets exactly what the simulated GPU gives its
allocator.

What is compared. The simulated GPU of ``fit`` (``SIZE:smXY`` or a catalog name) lets
the allocator reserve ``GpuSpec.capacity``: the total memory less the memory the
process holds outside the allocator (the CUDA context and library handles,
``non_pytorch_bytes``; ``cudaMalloc`` fails there once reserved plus that memory would
pass the total). On a larger real GPU, ``torch.cuda.set_per_process_memory_fraction(f)``
lets the allocator reserve ``int(f x total_memory)`` bytes (``setMemoryFraction`` in
c10/cuda/CUDACachingAllocator.cpp), and the context does not count against it (it
lives outside the allocator, on a GPU with room to spare). So the real run is capped
with the smallest ``f`` whose ``int(f x total_memory)`` is the simulated capacity, not
with ``f = SIZE / total_memory``: that one would give the real allocator the simulated
GPU's non-PyTorch memory on top (500 MiB on a 12 GiB Hopper-class GPU), and answer
another question than the simulation did. The record keeps both figures.

Steps: (1) unless ``batch`` is given, ``python -m gpu_mem_track fit --json`` on the
script (its "as it is" row's largest batch); (2) ``run --simulate`` of that batch and
the next, for the simulated figures (peaks, the out-of-memory message); (3) unless
``dry``, each batch plainly under the fraction (a small wrapper sets it, then runs the
script as ``python`` would) with ``max_memory_allocated``/``max_memory_reserved``,
whether it ran out, and torch's message. The record is written as JSON to ``out`` and
as markdown beside it (``out`` with ``.md``).

``check_edge(...)`` is the entry point for ``scripts/gpu/gpu_check.py``; the command line:

    python scripts/gpu/gpu_check_edge.py --gpu 12GiB:sm90 --batch-arg 0 --out edge.json \\
        [--batch N] [--dry] [--run-to-end] [--timeout S] -- train.py 16 1024
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu_mem_track.advisor.batch import BatchArg  # noqa: E402
from gpu_mem_track.errors import UsageError  # noqa: E402
from gpu_mem_track.runfolder.files import read_meta  # noqa: E402
from gpu_mem_track.simgpu.catalog import parse_gpu  # noqa: E402

__all__ = ["CAPPED", "check_edge", "fraction_for", "main", "render"]

MIB = 2**20

#: Caps the allocator at ``allowed`` bytes of this GPU (the smallest fraction f with
#: int(f x total_memory) >= allowed, as ``fraction_for``), runs the script as ``python``
#: would, and writes what happened to the JSON path given first.
CAPPED = """
import json, math, os, runpy, sys, traceback, torch
out, allowed, script, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
total = torch.cuda.get_device_properties(0).total_memory
fraction = min(allowed / total, 1.0)
while fraction < 1.0 and int(fraction * total) < allowed:
    fraction = math.nextafter(fraction, 2.0)
torch.cuda.set_per_process_memory_fraction(fraction, 0)
sys.argv, sys.path[0] = [script, *args], os.path.dirname(os.path.abspath(script))
result = {"out_of_memory": False, "exit_code": 0, "message": "", "fraction": fraction,
          "total_memory": total, "allowed": int(fraction * total), "device": torch.cuda.get_device_name(0)}
try:
    runpy.run_path(script, run_name="__main__")
except torch.OutOfMemoryError as exc:
    traceback.print_exc()
    result.update(out_of_memory=True, exit_code=1, message=str(exc))
except SystemExit as exc:
    result["exit_code"] = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
stats = torch.cuda.memory_stats(0)
result.update(max_memory_allocated=torch.cuda.max_memory_allocated(0),
              max_memory_reserved=torch.cuda.max_memory_reserved(0),
              num_alloc_retries=stats.get("num_alloc_retries", 0), num_ooms=stats.get("num_ooms", 0))
with open(out, "w") as stream:
    json.dump(result, stream)
sys.exit(result["exit_code"])
"""


def fraction_for(allowed: int, total_memory: int) -> float:
    """The smallest memory fraction ``f`` with ``int(f x total_memory) >= allowed``
    (``setMemoryFraction`` truncates), so the allocator gets ``allowed`` bytes (1.0 when
    ``allowed`` is the whole GPU or more: torch then sets no limit)."""
    if allowed <= 0 or total_memory <= 0:
        raise ValueError(f"need positive bytes, not allowed={allowed}, total_memory={total_memory}")
    fraction = min(allowed / total_memory, 1.0)
    while fraction < 1.0 and int(fraction * total_memory) < allowed:
        fraction = math.nextafter(fraction, 2.0)
    return fraction


def _run(argv: list[str], cwd: Path, timeout: float, log: Path) -> tuple[int | None, str]:
    """Run ``argv`` in ``cwd``; its output goes to ``log``. (exit code or None when it
    ran past ``timeout``, the last lines of its output)."""
    env = dict(os.environ)  # the subprocesses import this checkout's package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    with log.open("w") as stream:
        try:
            code: int | None = subprocess.run(
                argv, cwd=cwd, env=env, stdout=stream, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    text = log.read_text(errors="replace")
    return code, "\n".join(text.splitlines()[-5:])


def _fit_batch(script: Path, args: Sequence[str], gpu: str, batch_arg: str, work: Path, options: list[str],
               timeout: float) -> tuple[int | None, dict[str, Any]]:  # fmt: skip
    """``fit``'s largest batch of the script as it is, and what it said of it."""
    argv = [sys.executable, "-m", "gpu_mem_track", "fit", f"--batch-arg={batch_arg}", "--json"]
    argv += ["--out-dir", str(work / "fit"), *options, gpu, str(script), *args]
    code, tail = _run(argv, script.parent, timeout, work / "fit.log")
    text = (work / "fit.log").read_text(errors="replace")
    start = 0 if text.startswith("{") else text.rfind("\n{") + 1
    try:
        answer = json.loads(text[start:]) if code in (0, 1) and start >= 0 else None
    except ValueError:
        answer = None
    if not answer:
        return None, {"error": f"fit exited with {code}: {tail}"}
    row = next((r for r in answer.get("rows", []) if r.get("label") == "as it is"), None)
    best = (row or {}).get("batch") or {}
    said = {"verdict": answer.get("verdict"), "capacity": answer.get("capacity")}
    said["reserved_peak"] = best.get("reserved_peak")
    return (best.get("batch") or None), said


def _simulated(script: Path, args: list[str], gpu: str, work: Path, name: str, options: list[str],
               timeout: float) -> dict[str, Any]:  # fmt: skip
    """``run --simulate`` of one batch: its peaks and out-of-memory record."""
    argv = [sys.executable, "-m", "gpu_mem_track", "run", "--simulate", gpu, "--out-dir", str(work / "sim")]
    argv += ["--run-name", name, *options, str(script), *args]
    code, tail = _run(argv, script.parent, timeout, work / f"{name}.log")
    try:
        info = read_meta(work / "sim" / name / "meta.json")
    except Exception as exc:  # noqa: BLE001 - a failed trial is a row, not a crash
        return {"error": f"run --simulate exited with {code}: {exc}; {tail}"}
    oom = info.simulation.out_of_memory if info.simulation is not None else None
    return {
        "exit_code": info.exit_code,
        "out_of_memory": oom is not None,
        "peak": info.peak,
        "reserved_peak": info.reserved_peak,
        "message": (oom or {}).get("message", ""),
        "reserved_at_oom": (oom or {}).get("reserved"),
        "allocated_at_oom": (oom or {}).get("allocated"),
    }


def _real(
    script: Path, args: list[str], allowed: int, work: Path, name: str, timeout: float
) -> dict[str, Any]:
    """The batch run plainly on this GPU, its allocator capped at ``allowed`` bytes."""
    wrapper, figures = work / "capped.py", work / f"{name}.json"
    wrapper.write_text(CAPPED)
    argv = [sys.executable, str(wrapper), str(figures), str(allowed), str(script), *args]
    started = time.monotonic()
    code, tail = _run(argv, script.parent, timeout, work / f"{name}.log")
    try:
        got = json.loads(figures.read_text())
    except (OSError, ValueError):
        why = "ran past the time limit" if code is None else f"exited with {code} without its figures"
        return {"error": f"{why}: {tail}"}
    got["seconds"] = round(time.monotonic() - started, 1)
    got["ran"] = got["exit_code"] == 0 and not got["out_of_memory"]
    return got


def check_edge(
    script: str | Path,
    args: Sequence[str],
    *,
    gpu: str,
    batch_arg: str,
    out: str | Path,
    batch: int | None = None,
    dry: bool = False,
    run_to_end: bool = False,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run the edge claims of ``fit`` for ``script`` ``args`` on the simulated ``gpu``
    (see the module doc) and return the record, also written as JSON to ``out`` and as
    markdown to ``out`` with ``.md``. ``batch``: the largest batch that fits, as ``fit``
    said it (None: ask ``fit``); ``dry``: the simulated side only (no GPU needed);
    ``run_to_end``: passed to ``fit`` and the simulated runs; ``timeout``: seconds for
    each step. ``UsageError`` for a bad ``gpu`` or ``batch_arg``."""
    script, out = Path(script).resolve(), Path(out)
    spec = parse_gpu(gpu)
    where = BatchArg.parse(batch_arg)
    options = ["--run-to-end"] if run_to_end else []
    record: dict[str, Any] = {
        "script": str(script),
        "args": list(args),
        "gpu": spec.name,
        "batch_arg": batch_arg,
        "dry": dry,
        "simulated_total_memory": spec.total_memory,
        "simulated_non_pytorch": spec.non_pytorch_bytes,
        "allocator_capacity": spec.capacity,
        "rows": [],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-edge-") as tmp:
        work = Path(tmp)
        if batch is None:
            batch, record["fit"] = _fit_batch(script, args, gpu, batch_arg, work, options, timeout)
        record["batch"] = batch
        for size, claim in ((batch, "fits"), ((batch or 0) + 1, "runs out")) if batch else ():
            batch_args = where.with_batch(list(args), size)
            row: dict[str, Any] = {"batch": size, "claim": claim}
            row["simulated"] = _simulated(script, batch_args, gpu, work, f"sim-b{size}", options, timeout)
            if not dry:
                row["real"] = _real(script, batch_args, spec.capacity, work, f"real-b{size}", timeout)
                ran = row["real"].get("ran")
                row["agrees"] = None if ran is None else ran == (claim == "fits")
            record["rows"].append(row)
    out.write_text(json.dumps(record, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(record))
    return record


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / MIB:,.1f}"


def _yes(flag: Any) -> str:
    return {None: "-", True: "yes", False: "no"}[flag]


def render(record: dict[str, Any]) -> str:
    """The record as markdown: what was capped at what, and one row per batch."""
    cap = record["allocator_capacity"]
    how = "dry: no real runs" if record["dry"] else "by the memory fraction"
    lines = [
        f"# Edge claims of fit on {record['gpu']}",
        "",
        f"`{Path(record['script']).name} {' '.join(record['args'])}`, batch argument {record['batch_arg']}.",
        f"The simulated GPU gives its allocator {_mib(cap)} MiB: "
        f"{_mib(record['simulated_total_memory'])} MiB less {_mib(record['simulated_non_pytorch'])} MiB "
        "outside the allocator (CUDA context, libraries). Each real run's allocator is capped at that "
        f"({how}); a fraction of SIZE / total memory would give it the non-PyTorch memory on top.",
        "",
    ]
    if not record.get("batch"):
        why = record.get("fit", {}).get("error", "none fits")
        lines.append(f"No edge: fit found no largest batch ({why}).")
        return "\n".join(lines) + "\n"
    lines += [
        "| batch | claim | simulated: ran out | sim peak MiB | sim reserved MiB | GPU: ran "
        "| GPU allocated MiB | GPU reserved MiB | agrees |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in record["rows"]:
        sim, real = row["simulated"], row.get("real") or {}
        sim_out = "error" if "error" in sim else _yes(sim["out_of_memory"])
        ran = "-" if not real else "error" if "error" in real else _yes(real["ran"])
        agrees = {None: "-", True: "yes", False: "**no**"}[row.get("agrees")]
        lines.append(
            f"| {row['batch']} | {row['claim']} | {sim_out} | {_mib(sim.get('peak'))} "
            f"| {_mib(sim.get('reserved_peak'))} | {ran} | {_mib(real.get('max_memory_allocated'))} "
            f"| {_mib(real.get('max_memory_reserved'))} | {agrees} |"
        )
        for side, part in (("simulated", sim), ("GPU", real)):
            if part.get("message") or part.get("error"):
                notes.append(f"- batch {row['batch']}, {side}: {part.get('message') or part.get('error')}")
        if "allowed" in real:
            notes.append(
                f"- batch {row['batch']}: fraction {real['fraction']!r} of {_mib(real['total_memory'])} MiB "
                f"({real['device']}): {real['allowed']:,} B allowed (simulated capacity {cap:,} B)"
            )
    return "\n".join([*lines, "", *notes]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module doc); exit 0 when every row agrees (or dry), 1
    when one does not, 2 for a usage mistake."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gpu", required=True, help="the simulated GPU fit was asked about (H100-80GB, 12GiB:sm90)"
    )
    parser.add_argument(
        "--batch-arg", required=True, help="the script's batch argument, as fit's --batch-arg"
    )
    parser.add_argument("--out", required=True, help="JSON file to write (the markdown goes beside it, .md)")
    parser.add_argument(
        "--batch", type=int, help="the largest batch that fits, as fit said (default: ask fit)"
    )
    parser.add_argument("--dry", action="store_true", help="the simulated side only (no GPU needed)")
    parser.add_argument("--run-to-end", action="store_true", help="passed to fit and to the simulated runs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for each step (default: 600)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments (after --)")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    if not Path(options.script).is_file():
        print(f"gpu_check_edge: no script {options.script}", file=sys.stderr)
        return 2
    if options.batch is not None and options.batch < 1:
        print("gpu_check_edge: --batch must be at least 1", file=sys.stderr)
        return 2
    try:
        record = check_edge(
            options.script, args, gpu=options.gpu, batch_arg=options.batch_arg, out=options.out,
            batch=options.batch, dry=options.dry, run_to_end=options.run_to_end, timeout=options.timeout,
        )  # fmt: skip
    except UsageError as exc:
        print(f"gpu_check_edge: {exc}", file=sys.stderr)
        return 2
    print(render(record))
    return 1 if any(row.get("agrees") is False for row in record["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
