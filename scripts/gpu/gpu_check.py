"""One command that checks gpu_mem_track on the GPU of this machine, in about 5 minutes.

    python3 scripts/gpu/gpu_check.py [--out DIR] [--fixtures DIR] [--budget 300] [--dry] [--only NAMES]

(``make gpu-check`` runs it; ``--only`` takes workload names and ``fit``.) In order, each
step in a subprocess with a timeout, with a progress line and its elapsed seconds:

1. what this machine has (a subprocess imports torch, so this process never holds a CUDA
   context); the GPU is mapped to the simulated GPU's catalog
   (``gpu_mem_track/simgpu/catalog.py``) by its name and memory, else given as ``SIZE:smXY``;
2. ``python -m gpu_mem_track probe`` alone (its driver figures would count other processes'
   memory where NVML lists this process under another pid);
3. at once: the quick suite without the ``cuda`` tests (pytest-xdist ``-n``, whole files
   per worker, when it is importable), and per training script its plain run
   (scripts/gpu/gpu_check_wrap.py: ``max_memory_allocated``/``reserved`` and a snapshot, which
   the ``snapshot`` command then replays), its run under ``run`` and under
   ``run --simulate <this GPU>`` (CPU only);
   beside them, the advisor (``fit``, scripts/gpu/gpu_check_fit.py) on nanoGPT's GPT-2 for a
   simulated 24 GB GPU;
4. the ``cuda``-marked tests, alone, one process; then the advisor's claims on this GPU:
   the script as it is, its recommended change and that change's largest batch (and one
   more), each capped by ``set_per_process_memory_fraction`` at the simulated GPU's
   capacity;
5. quiet: the launch-bound loop (nanoGPT char) and the GPU-bound one (GPT-2 124M) plainly,
   under ``run`` and under ``run`` with the native paths off (``GPU_MEM_TRACK_NATIVE=off``),
   their own per-iteration times compared (medians after warm-up); then
   ``scripts/bench/bench_line.py`` on the GPU (the dict read against the native one).

With a GPU, step 2 runs beside the build of the native modules
(``python -m gpu_mem_track.native.build``), and a step says which reader the runner's CUDA
sampler then uses.

The scripts are the package's examples (scripts/gpu/gpu_check_train.py) and nanoGPT's
train.py (char config, and GPT-2 124M) with the arguments of the H200 recordings, when its
folder is found: ``--fixtures DIR``, ``$GPU_MEM_TRACK_FIXTURES``, ``.gpu_fixtures/`` in the
checkout, or ``shared/fixtures`` beside it (``DIR/h200/clients/nanogpt``); it runs in a
temporary copy, after its ``make_data.py``. Results go to
``reports/gpu_check/<gpu>/`` (or ``--out``): report.md (with the native reader's status and
bench_line's table), report.json and the logs
(tests-quick.log, tests-cuda.log, probe.log, runs.log); snapshots are summarised, not kept.
A part that fails or runs out of time is named in the report, and the command still exits
0 with its tables. Without a GPU (or with ``--dry``) it says so and runs the simulated
parts only. Children get ``PYTHONPATH`` = this checkout first, so nothing is installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import gpu_check_fit as fit  # noqa: E402
import gpu_check_report as report  # noqa: E402
from gpu_check_steps import (  # noqa: E402
    Check,
    Workload,
    in_parallel,
    plainly,
    pytest_step,
    python,
    simulate,
    timing_row,
    under_runner,
)

from gpu_mem_track.simgpu.catalog import GPUS, parse_gpu  # noqa: E402

ENV = "GPU_MEM_TRACK_FIXTURES"
TRAIN = ROOT / "scripts" / "gpu" / "gpu_check_train.py"
DRY_GPU = "H100-80GB"
# nanoGPT's arguments as recorded on the H200 (fixtures/h200/README.md), more iterations for the medians.
NANOGPT_COMMON = ["--compile=False", "--eval_iters=2", "--eval_interval=1000", "--log_interval=1"]
NANOGPT = {
    "nanogpt-char": ["config/train_shakespeare_char.py", *NANOGPT_COMMON, "--max_iters=40"],
    "nanogpt-gpt2": [*NANOGPT_COMMON, "--batch_size=12", "--gradient_accumulation_steps=4", "--max_iters=12"],
}
EXAMPLES = {"convnet": ["--batch", "256", "--iters", "30"], "transformer": ["--batch", "64", "--iters", "30"]}
DETECT = """
import importlib.util as u, json, platform
names = ("pytest", "xdist", "numpy", "pynvml", "pandas", "tabulate")
out = {"python": platform.python_version(), "modules": {m: bool(u.find_spec(m)) for m in names}}
import torch
out.update(torch=torch.__version__, cuda=torch.cuda.is_available())
if out["cuda"]:
    p = torch.cuda.get_device_properties(0)
    out.update(device_count=torch.cuda.device_count(), device_name=p.name, total_memory=p.total_memory,
               capability=[p.major, p.minor])
print("DETECT" + json.dumps(out))
"""


READER = """
import torch
from gpu_mem_track.runner.samplers import CudaSampler
from gpu_mem_track.native import cudastats
x = torch.zeros(1 << 20, device="cuda")
sampler = CudaSampler("cuda:0")
print("first sample", sampler.sample(), "read by", sampler.stats_reader)
print("cuda_stats:", cudastats.status())
"""


def detect(check: Check) -> dict[str, Any]:
    """What this machine has, from a subprocess (``{}`` with the reason when torch fails)."""
    outcome = check.run("detect", [python(), "-c", DETECT], ROOT, 90)
    found = re.search(r"^DETECT(.*)$", outcome.output, re.MULTILINE)
    if not found:
        return {"error": (outcome.output.strip().splitlines() or [outcome.status])[-1]}
    return json.loads(found.group(1))


def catalog_gpu(name: str, total: int, capability: list[int]) -> str:
    """The catalog name of the GPU torch calls ``name``: its device name, else a catalog
    model word in the name with the same capability and memory within 3%; else
    ``SIZE:smXY`` from what torch reports."""
    for spec in GPUS.values():
        if spec.device_name.lower() == name.lower():
            return spec.name
    words = set(re.findall(r"[a-z0-9]+", name.lower()))
    near = [
        spec
        for spec in GPUS.values()
        if next((w for w in spec.name.lower().split("-") if re.search(r"\d", w)), "") in words
        and list(spec.capability) == list(capability)
        and abs(spec.total_memory / total - 1) <= 0.03
    ]
    if near:
        return min(near, key=lambda spec: abs(spec.total_memory - total)).name
    return f"{total // 2**20}MiB:sm{capability[0]}{capability[1]}"


def find_nanogpt(given: Path | None) -> Path | None:
    """The nanoGPT client folder (holding train.py), from the places the docstring names."""
    roots = [given] if given else []
    if os.environ.get(ENV):
        roots.append(Path(os.environ[ENV]))
    roots += [ROOT / ".gpu_fixtures", ROOT.parent / "shared/fixtures", ROOT.parent.parent / "shared/fixtures"]
    for base in roots:
        for folder in (base / "h200/clients/nanogpt", base / "clients/nanogpt", base / "nanogpt", base):
            if (folder / "train.py").is_file() and (folder / "model.py").is_file():
                return folder
    return None


def workloads(check: Check, nanogpt: Path | None, only: set[str]) -> list[Workload]:
    """The training scripts to run; nanoGPT's in a temporary copy after its make_data.py."""
    found = [Workload(name, [str(TRAIN), name, *args], check.tmp) for name, args in EXAMPLES.items()]
    if nanogpt is None:
        check.skip("nanoGPT", f"no nanoGPT client found (give --fixtures DIR or set {ENV})")
    elif not only or only & {*NANOGPT, "fit"}:
        copy = check.tmp / "nanogpt"
        shutil.copytree(nanogpt, copy, ignore=shutil.ignore_patterns("data", "out*", "__pycache__"))
        if check.run("nanoGPT make_data.py", [python(), "make_data.py"], copy, 60).ok:
            kinds = {"nanogpt-char": "launch-bound", "nanogpt-gpt2": "GPU-bound"}
            found += [Workload(n, ["train.py", *a], copy, kinds[n]) for n, a in NANOGPT.items()]
    if not any(w.timed for w in found):  # no nanoGPT run: time the examples, and say so
        for w in found:
            w.timed = {"convnet": "launch-bound (no nanoGPT run)", "transformer": "small (no nanoGPT run)"}[
                w.name
            ]
    return [w for w in found if not only or w.name in only]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="report folder (default: reports/gpu_check/<gpu>/)")
    parser.add_argument("--fixtures", type=Path, help=f"folder holding h200/clients/nanogpt (or ${ENV})")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for everything (default 300)")
    parser.add_argument(
        "--dry", action="store_true", help="simulated parts only, as on a machine with no GPU"
    )
    parser.add_argument("--gpu", help=f"catalog GPU to simulate (default: this GPU's; dry: {DRY_GPU})")
    parser.add_argument(
        "--only", help="comma-separated workloads (convnet,transformer,nanogpt-char,nanogpt-gpt2,fit)"
    )
    parser.add_argument("--no-tests", action="store_true", help="skip both pytest runs")
    parser.add_argument("--no-xdist", action="store_true", help="run the quick suite in one process")
    args = parser.parse_args(argv)
    if args.budget < 30:
        parser.error("--budget must be at least 30 seconds")
    if args.out and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a folder")
    if args.fixtures and not args.fixtures.is_dir():
        parser.error(f"no such folder: {args.fixtures}")
    if args.gpu:
        try:
            parse_gpu(args.gpu)
        except Exception as exc:  # the catalog's UsageError: one line
            parser.error(str(exc))
    known = {*EXAMPLES, *NANOGPT, "fit"}
    args.only = {n.strip() for n in (args.only or "").split(",") if n.strip()}
    if args.only - known:
        parser.error(
            f"unknown workload(s) {', '.join(sorted(args.only - known))}: "
            f"choose from {', '.join(sorted(known))}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    check = Check(args.budget, tmp)
    try:
        data = checks(check, args, started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = args.out or ROOT / "reports" / "gpu_check" / re.sub(r"[^A-Za-z0-9.+-]+", "-", data["gpu_label"])
    write(out, check, data)
    print(report.render_memory_table(data["memory"]) + "\n" + report.render_timing_table(data["timing"]))
    for line in data["skipped"] + data["failed"]:
        print(line)
    print(f"gpu_check: {check.elapsed():.0f} s; report in {out}/report.md")
    return 0


def checks(check: Check, args: argparse.Namespace, started: str) -> dict[str, Any]:
    env = detect(check)
    dry = "--dry given" if args.dry else ("" if env.get("cuda") else "no CUDA GPU visible to torch")
    if "error" in env:
        dry = f"torch does not import: {env['error']}"
    gpu = args.gpu or (
        DRY_GPU if dry else catalog_gpu(env["device_name"], env["total_memory"], env["capability"])
    )
    check.say(
        f"GPU: {env.get('device_name') or 'none'}; simulating {gpu}" + (f"; DRY MODE ({dry})" if dry else "")
    )
    label = f"dry-{gpu}" if dry else gpu
    cpus = os.cpu_count() or 2
    if not dry:  # the native readers build (CPU) while probe measures the driver (GPU)
        in_parallel(
            [
                lambda: check.run("probe", [python(), "-m", "gpu_mem_track", "probe"], ROOT, 60),
                lambda: check.run("native build", [python(), "-m", "gpu_mem_track.native.build"], ROOT, 120),
            ],
            workers=2,
        )
        reader = check.run("native reader", [python(), "-c", READER], ROOT, 60)
        check.put("_native", "reader", reader.output.strip()[-2000:])
    loads = workloads(check, find_nanogpt(args.fixtures), args.only)
    phase_a = check.start + 0.55 * args.budget
    tasks: list[Callable[[], Any]] = []
    fit_copy = check.tmp / "nanogpt"
    fit_on = (not args.only or "fit" in args.only) and (fit_copy / "data").is_dir()
    answer: dict[str, Any] = {}
    if fit_on:  # the advisor (CPU) beside the other simulated parts
        tasks.insert(0, lambda: answer.update(fit.advise(check, fit_copy, phase_a) or {}))
    elif not args.only or "fit" in args.only:
        check.skip("fit", "no nanoGPT client")
    for w in sorted(loads, key=lambda w: not w.name.startswith("nanogpt")):  # the longest first
        if not dry:
            tasks.append(lambda w=w: real_memory(check, w, phase_a))
        tasks.append(lambda w=w: simulate(check, w, gpu, phase_a))
    tests: dict[str, str] = {}
    modules = env.get("modules", {})
    no_tests = (
        "dry mode" if dry else "--no-tests" if args.no_tests else "" if modules["pytest"] else "no pytest"
    )
    if no_tests:
        check.skip("tests", no_tests)
    else:
        # Whole files per worker: a file's tests may share module state or a fixture's folder.
        xdist = (
            ["-n", str(max(2, min(6, cpus // 2))), "--dist", "loadfile"]
            if modules["xdist"] and not args.no_xdist
            else []
        )
        if not xdist:
            check.say("the quick suite runs in one process (pytest-xdist not importable, or --no-xdist)")
        # pytest-benchmark turns itself off under xdist with a warning, which the suite's
        # filterwarnings=error makes an internal error: leave that plugin out
        quick = ["-m", "not slow and not cuda", "-p", "no:benchmark", *xdist]
        tasks.insert(
            0,
            lambda: tests.__setitem__("quick suite", pytest_step(check, "tests-quick", quick, 170, phase_a)),
        )
    in_parallel(tasks, workers=max(2, min(8, cpus // 2)))
    if not no_tests:
        until = check.start + 0.72 * args.budget
        tests["cuda-marked"] = pytest_step(check, "tests-cuda", ["-m", "cuda", "-rs"], 90, until)
    if answer and not dry:  # the advisor's claims on this GPU, capped at the simulated capacity
        fit.real_runs(check, fit_copy, answer, env["total_memory"], check.start + 0.8 * args.budget)
    timing = [] if dry else [time_loop(check, w) for w in loads if w.timed]
    bench = ""
    if dry:
        check.skip("timing", "dry mode")
    else:  # the read alone, dict against native, on this GPU
        bench_out = check.tmp / "bench_line.md"
        check.run("bench_line", [python(), "scripts/bench/bench_line.py", "--out", str(bench_out)], ROOT, 60)
        bench = bench_out.read_text() if bench_out.is_file() else ""
    probe = next((s.output for s in check.steps if s.name == "probe"), "")
    results = {w.name: check.results.get(w.name, {}) for w in loads}  # in the workloads' order
    skipped = [s for s in check.steps if s.status.startswith("skipped")]
    failed = [s for s in check.steps if not s.ok and s not in skipped]
    return {
        "gpu_label": label, "simulated_gpu": gpu, "dry": dry, "started": started, "budget": args.budget,
        "seconds": check.elapsed(), "environment": env, "tests": tests, "probe": probe,
        "native": check.results.get("_native", {}).get("reader", ""), "bench_line": bench,
        "memory": report.memory_rows(results), "timing": timing, "results": results,
        "fit": check.results.get("fit", {}),
        "skipped": [f"{s.name} {s.status[len('skipped '):]}" for s in skipped],
        "failed": [f"{s.name}: {s.status}{s.why}" for s in failed],
        "steps": [s.to_dict() for s in check.steps],
    }  # fmt: skip


def real_memory(check: Check, w: Workload, until: float) -> None:
    """Phase 3 on the GPU: the plain run with its snapshot, then (untimed loops) ``run``."""
    plainly(check, w, "plain", snapshot=True, until=until)
    if not w.timed:
        under_runner(check, w, "runner", until)


def time_loop(check: Check, w: Workload) -> dict[str, Any]:
    """Phase 5, alone on the machine: plain, under ``run``, and under ``run`` reading the
    allocator's statistics dict (the native CUDA reader off)."""
    until = check.deadline - 8
    plain = plainly(check, w, "timed-plain", snapshot=False, until=until)
    runner = under_runner(check, w, "timed-runner", until)
    dict_read = under_runner(check, w, "timed-runner-dict", until, env={"GPU_MEM_TRACK_NATIVE": "off"})
    return timing_row(check, w, plain, runner, dict_read)


def write(out: Path, check: Check, data: dict[str, Any]) -> None:
    """report.md, report.json and the logs (each log's output cut to its last 2 MB)."""
    out.mkdir(parents=True, exist_ok=True)
    logs = check.results.get("_logs", {})
    for name in ("tests-quick", "tests-cuda"):
        if name in logs:
            (out / f"{name}.log").write_text(logs[name][-2_000_000:])
    runs = []
    for step in check.steps:
        if step.name == "probe":
            (out / "probe.log").write_text(step.output)
        elif not step.name.startswith("tests-"):
            runs.append(f"===== {step.name}: {step.status} ({step.seconds:.1f} s)\n{step.output[-6000:]}\n")
    (out / "runs.log").write_text("".join(runs)[-2_000_000:])
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "report.md").write_text(report.render_report(data))


if __name__ == "__main__":
    sys.exit(main())
