"""One command that checks gpu_mem_track on the GPU of this machine: the fidelity report.

    python3 scripts/gpu/gpu_check.py [--out DIR] [--fixtures DIR] [--budget 560] [--rounds 3]
        [--only NAMES] [--skip NAMES] [--archive PATH.tar.gz] [--dry] [--list]

(``make gpu-check`` runs it.) Every step is a subprocess with a timeout, printed with its
elapsed seconds. The parts run in this order, each within a slot that ends at a fixed
share of the budget (:data:`PARTS`; a step that cannot start before its slot ends is
skipped and said so, one still running then is interrupted):

1. ``setup``: what this machine has (a subprocess imports torch, so this process never
   holds a CUDA context; the GPU is mapped to the simulated GPU's catalog by its name and
   memory, else given as ``SIZE:smXY``); then ``python -m gpu_mem_track probe`` beside
   the native modules' build, and which reader the runner's CUDA sampler then uses;
2. at once, in the busy slot: ``memory``: every workload of the registry
   (scripts/gpu/gpu_check_workloads.py) plainly (scripts/gpu/gpu_check_wrap.py:
   ``max_memory_allocated``/``reserved``, and a snapshot that the ``snapshot`` command
   replays), under ``run --simulate <this GPU>`` (CPU) and under ``run``; ``fit``: the
   advisor on nanoGPT's GPT-2 for a simulated 24 GB GPU, then its edge claims on this GPU
   (scripts/gpu/gpu_check_fit.py, scripts/gpu/gpu_check_edge.py); ``tests``: the quick
   suite without the ``cuda`` tests (pytest-xdist, whole files per worker, when it imports);
3. alone, in the quiet slot: ``cost``: each timed loop of the registry (nanoGPT char,
   launch-bound; GPT-2 124M, GPU-bound) plainly and under ``run``, ``--rounds`` rounds,
   the ratio of their own median iteration times per round: min, median and max against
   issue 29's targets (1.05x, 1.02x);
4. ``evidence``: what the model has no recording of yet (:data:`EVIDENCE`): rank 0 of
   FSDP2 and DDP in torch's fake process group against the simulated rank 0, the backends
   and workspaces of a grid of convolutions, compiled peaks against eager;
5. ``cuda-tests`` (the ``cuda``-marked tests, one process, alone: some read the driver's
   memory, which counts other processes), then ``bench-line`` (scripts/bench/bench_line.py
   on this GPU, shortened).

By value the parts rank memory, cost, fit, tests, evidence, cuda-tests, bench-line; setup comes
first because the others need it, and cost waits for the busy slot to end because it
must run alone. The default budget (560 s) leaves a 10-minute command 40 s to spare. In
dry mode the busy slot runs to the end of the last one (nothing runs after it).

Workloads run from this checkout, or from nanoGPT's client folder when found
(``--fixtures DIR``, ``$GPU_MEM_TRACK_FIXTURES``, ``.gpu_fixtures/`` in the checkout, or
``shared/fixtures`` beside it: ``DIR/h200/clients/nanogpt``), in a temporary copy after its
``make_data.py``. A registered workload whose script is not here is skipped as "missing".
Results go to ``reports/gpu_check/<gpu>/`` (or ``--out``): report.md, report.json,
runs.log, probe.log, tests-quick.log/.xml, tests-cuda.log/.xml, rewritten after every
step, so a check cut off from outside keeps what it had; ``--archive`` packs that folder
into one .tar.gz (after each slot and at the end). A part that fails or runs out of time
is named in the report, and the command still exits 0. Without a GPU (or with ``--dry``) it
says so and runs the simulated parts only. Children get ``PYTHONPATH`` = this checkout
first, so nothing is installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import gpu_check_fit as fit  # noqa: E402
import gpu_check_report as report  # noqa: E402
import gpu_check_steps as steps  # noqa: E402
import gpu_check_workloads as registry  # noqa: E402
from gpu_check_clock import PART, Check, in_parallel, python  # noqa: E402

from gpu_mem_track.simgpu.catalog import GPUS, parse_gpu  # noqa: E402

ENV = "GPU_MEM_TRACK_FIXTURES"
DRY_GPU = "H100-80GB"
#: At most this many runs on the GPU at once (the memory slot's plain, runner and edge runs).
GPU_SLOTS = 3


@dataclass(frozen=True)
class Part:
    """A part of the check: its ``slot`` ends at this share of the budget."""

    name: str
    slot: float
    what: str


PARTS: tuple[Part, ...] = (
    Part("setup", 0.08, "what the machine has; probe beside the native build; the runner's CUDA reader"),
    Part("memory", 0.42, "each workload plainly, under run --simulate and under run: peaks compared"),
    Part("fit", 0.42, "the advisor on nanoGPT GPT-2 (simulated), then its edge claims on this GPU"),
    Part("tests", 0.42, "the quick suite (not slow, not cuda), beside memory and fit"),
    Part("cost", 0.70, "the runner's cost: each timed loop plainly and under run, in rounds, alone"),
    Part("evidence", 0.84, "rank 0 of FSDP2/DDP in a fake process group, conv backends, compiled peaks"),
    Part("cuda-tests", 0.92, "the cuda-marked tests, one process, alone"),
    Part("bench-line", 0.97, "scripts/bench/bench_line.py on this GPU, after the cuda tests"),
)
CHOSEN = [p.name for p in PARTS if p.name != "setup"]
DETECT = """
import importlib.util as u, json, platform, sys
out = {"python": platform.python_version(), "modules": {m: bool(u.find_spec(m)) for m in sys.argv[1:]}}
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


class Session:
    """One check: its options, what the machine has, the parts' states, and the report
    folder, rewritten (``save``) after every step."""

    def __init__(self, args: argparse.Namespace, check: Check, command: str) -> None:
        self.args, self.check, self.command = args, check, command
        self.started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        self.env: dict[str, Any] = {}
        self.dry = ""
        self.gpu = args.gpu or DRY_GPU
        self.label = ""
        self.out: Path | None = None
        self.entries: list[dict[str, Any]] = []
        self.loads: list[registry.Workload] = []
        self.tests: dict[str, str] = {}
        self.cost: list[dict[str, Any]] = []
        self.bench = ""
        self.finished = False
        self.parts = {
            p.name: {
                "name": p.name,
                "what": p.what,
                "slot_end": p.slot * args.budget,
                "status": "not reached",
            }
            for p in PARTS
        }
        self._writing = threading.Lock()

    def chosen(self, part: str) -> bool:
        """Whether ``--only``/``--skip`` leave ``part`` in: the parts ``--only`` names, else
        (when it names workloads only) the parts that run workloads, memory and cost;
        setup always runs."""
        if part == "setup":
            return True
        if part in self.args.skip:
            return False
        if self.args.only_parts:
            return part in self.args.only_parts
        return not self.args.only_loads or part in ("memory", "cost")

    def runs(self, name: str, why_not: str = "") -> bool:
        """Whether part ``name`` runs; when not (``why_not``, or not chosen by
        ``--only``/``--skip``), it is recorded as skipped with the reason."""
        if not self.chosen(name):
            why_not = "not chosen (--only/--skip)"
        if why_not:
            self.parts[name]["status"] = f"skipped ({why_not})"
            token = PART.set(name)
            self.check.skip(name, why_not)
            PART.reset(token)
        return not why_not

    def as_part(self, name: str, body: Callable[[], Any]) -> Callable[[], None]:
        """``body`` as part ``name``: its state running, then done (or stopped, with the
        exception, when the check itself fails: the other parts go on), its seconds, and
        the report saved."""

        def run() -> None:
            state = self.parts[name]
            state["status"] = "running"
            began = time.monotonic()
            token = PART.set(name)
            try:
                body()
                with self.check.lock:
                    mine = [s for s in self.check.steps if s.part == name]
                bad = [s for s in mine if not s.ok]
                state["status"] = f"done: {len(mine) - len(bad)} of {len(mine)} steps ok" if bad else "done"
            except Exception as exc:
                state["status"] = f"stopped by {type(exc).__name__}: {exc}"
                self.check.say(f"part {name}: {state['status']}")
            finally:
                PART.reset(token)
                state["seconds"] = time.monotonic() - began
                self.save()

        return run

    def data(self) -> dict[str, Any]:
        """report.json's content, as far as the check has come."""
        check = self.check
        with check.lock:
            steps_done = list(check.steps)
            results = json.loads(json.dumps(check.results, default=str))
        skipped = [s for s in steps_done if s.skipped]
        failed = [s for s in steps_done if not s.ok and not s.skipped]
        return {
            "gpu_label": self.label, "simulated_gpu": self.gpu, "dry": self.dry, "started": self.started,
            "command": self.command, "budget": self.args.budget, "seconds": check.elapsed(),
            "finished": self.finished, "environment": self.env,
            "parts": [dict(p) for p in self.parts.values()], "tests": dict(self.tests),
            "probe": next((s.output for s in steps_done if s.name == "probe"), ""),
            "native": results.get("_native", {}).get("reader", ""), "bench_line": self.bench,
            "memory": report.memory_rows(results, self.entries), "cost": self.cost,
            "results": {e["name"]: results.get(e["name"], {}) for e in self.entries},
            "fit": results.get("fit", {}), "edge": results.get("edge", {}),
            "skipped": [f"{s.name}: {s.status[len('skipped (') : -1]}" for s in skipped],
            "failed": [f"{s.name}: {s.status}{s.why}" for s in failed],
            "steps": [s.to_dict() for s in steps_done],
        }  # fmt: skip

    def save(self) -> None:
        """report.md, report.json, runs.log and probe.log, each replaced whole (a reader
        never sees half a file); nothing before the report folder is known."""
        if self.out is None:
            return
        with self._writing:
            data = self.data()
            runs, probe = [], ""
            for step in list(self.check.steps):
                if step.name == "probe":
                    probe = step.output
                elif not step.name.startswith("tests-"):
                    runs.append(
                        f"===== {step.name}: {step.status} ({step.seconds:.1f} s)\n{step.output[-6000:]}\n"
                    )
            files = {
                "report.json": json.dumps(data, indent=1, default=str),
                "report.md": report.render_report(data),
                "runs.log": "".join(runs)[-2_000_000:],
            }
            if probe:
                files["probe.log"] = probe
            try:
                for name, text in files.items():
                    temporary = self.out / f".{name}.tmp"
                    temporary.write_text(text)
                    os.replace(temporary, self.out / name)
            except OSError as exc:  # said, and the check goes on: its steps matter more than one write
                self.check.say(f"could not write the report in {self.out}: {exc}")

    def archive(self) -> None:
        """``--archive``: the report folder as one .tar.gz, replaced whole."""
        if not self.args.archive or self.out is None:
            return
        with self._writing:
            temporary = self.args.archive.with_name(self.args.archive.name + ".tmp")
            with tarfile.open(temporary, "w:gz") as tar:
                tar.add(
                    self.out,
                    arcname=self.out.name,
                    filter=lambda info: None if info.name.endswith(".tmp") else info,
                )
            os.replace(temporary, self.args.archive)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=f"workloads: {', '.join(registry.names())}; parts: {', '.join(CHOSEN)}",
    )
    parser.add_argument("--out", type=Path, help="report folder (default: reports/gpu_check/<gpu>/)")
    parser.add_argument("--fixtures", type=Path, help=f"folder holding h200/clients/nanogpt (or ${ENV})")
    parser.add_argument(
        "--budget",
        type=float,
        default=560.0,
        help="seconds for everything; the parts' slots are shares of it (default 560)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the runner's cost, per timed loop (default 3)"
    )
    parser.add_argument(
        "--dry", action="store_true", help="simulated parts only, as on a machine with no GPU"
    )
    parser.add_argument("--gpu", help=f"catalog GPU to simulate (default: this GPU's; dry: {DRY_GPU})")
    parser.add_argument(
        "--only",
        help="comma-separated workloads and parts to run: the parts named (workloads alone: memory and cost)",
    )
    parser.add_argument("--skip", help="comma-separated workloads and parts to leave out")
    parser.add_argument("--no-xdist", action="store_true", help="run the quick suite in one process")
    parser.add_argument("--archive", type=Path, help="also pack the report folder into this .tar.gz")
    parser.add_argument("--list", action="store_true", help="print the parts and the workloads, and exit")
    args = parser.parse_args(argv)
    if args.budget < 30:
        parser.error("--budget must be at least 30 seconds")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.out and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a folder")
    if args.fixtures and not args.fixtures.is_dir():
        parser.error(f"no such folder: {args.fixtures}")
    if args.archive and not args.archive.resolve().parent.is_dir():
        parser.error(f"--archive {args.archive}: no such folder {args.archive.parent}")
    if args.gpu:
        try:
            parse_gpu(args.gpu)
        except Exception as exc:  # the catalog's UsageError: one line
            parser.error(str(exc))
    known = {*registry.names(), *CHOSEN}
    for option in ("only", "skip"):
        names = {n.strip() for n in (getattr(args, option) or "").split(",") if n.strip()}
        if names - known:
            parser.error(
                f"--{option}: unknown name(s) {', '.join(sorted(names - known))}: "
                f"choose from {', '.join(registry.names() + CHOSEN)}"
            )
        setattr(args, option, names)
    args.only_parts = args.only & set(CHOSEN)
    args.only_loads = args.only - set(CHOSEN)
    return args


def listing() -> str:
    """``--list``: the parts with their slots, and the registry."""
    lines = ["parts (slot ends at a share of --budget):"]
    lines += [f"  {p.name:<11} {p.slot:>4.0%}  {p.what}" for p in PARTS]
    lines.append("workloads (in the order of value):")
    for e in registry.REGISTRY:
        where = e.script if e.home == registry.CHECKOUT else f"nanoGPT {e.script}"
        there = "" if e.home != registry.CHECKOUT or (ROOT / e.script).is_file() else "  [missing]"
        timed = f", timed ({e.kind}, target {e.target}x)" if e.kind else ""
        lines.append(f"  {e.name:<22} {e.family}{timed}: {where} {' '.join(e.args)}{there}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(listing())
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    check = Check(args.budget, tmp, GPU_SLOTS)
    command = shlex.join(["python3", "scripts/gpu/gpu_check.py", *(sys.argv[1:] if argv is None else argv)])
    session = Session(args, check, command)
    check.listeners.append(session.save)
    try:
        run_parts(session)
    finally:
        session.finished = True
        session.save()
        session.archive()
        shutil.rmtree(tmp, ignore_errors=True)
    data = session.data()
    print(report.render_memory_table(data["memory"]))
    if data["cost"]:
        print(report.render_cost_table(data["cost"]))
    for line in data["skipped"] + data["failed"]:
        print(line)
    print(f"gpu_check: {check.elapsed():.0f} s; report in {session.out}/report.md")
    if args.archive:
        print(f"gpu_check: archive {args.archive}")
    return 0


def run_parts(session: Session) -> None:
    """The parts, in order, each within its slot (see the module docstring)."""
    check, args = session.check, session.args
    slot = {p.name: check.at(p.slot) for p in PARTS}
    session.as_part("setup", lambda: setup(session, slot["setup"]))()
    if session.out is None:  # the setup itself failed before it knew the GPU (its part says how)
        check.say(f"setup: {session.parts['setup']['status']}; nothing else can run")
        return
    dry = "dry mode" if session.dry else ""
    if dry:  # nothing runs after the busy slot: it takes the time of the others
        for name in ("memory", "fit", "tests"):
            slot[name] = slot["bench-line"]
            session.parts[name]["slot_end"] = session.parts["bench-line"]["slot_end"]
    modules = session.env.get("modules", {})
    no_pytest = "" if modules.get("pytest") else "pytest does not import"
    copy = prepare_workloads(session)
    cpus = os.cpu_count() or 2
    busy: list[Callable[[], None]] = []
    if session.runs("memory", "" if session.loads else "no workload to run"):
        busy.append(
            session.as_part("memory", lambda: memory(session, slot["memory"], max(2, min(6, cpus // 2))))
        )
    if session.runs("fit", "" if copy else "no nanoGPT client (give --fixtures DIR)"):
        busy.append(session.as_part("fit", lambda: fit.run(check, copy, bool(dry), slot["fit"])))
    if session.runs("tests", dry or no_pytest):
        xdist = modules.get("xdist") and not args.no_xdist
        # Whole files per worker: a file's tests may share module state or a fixture's folder.
        # pytest-benchmark turns itself off under xdist with a warning, which the suite's
        # filterwarnings=error makes an internal error: that plugin is left out.
        quick = ["-m", "not slow and not cuda", "-p", "no:benchmark"]
        quick += ["-n", str(max(2, min(6, cpus // 2))), "--dist", "loadfile"] if xdist else []
        if not xdist:
            check.say("the quick suite runs in one process (pytest-xdist not importable, or --no-xdist)")
        busy.append(
            session.as_part(
                "tests", lambda: tests(session, "quick suite", "tests-quick", quick, slot["tests"])
            )
        )
    in_parallel(busy, workers=len(busy))
    session.archive()
    timed = [w for w in session.loads if w.timed]
    if session.runs("cost", dry or ("" if timed else "no timed loop to run (nanoGPT not found)")):
        session.as_part("cost", lambda: cost(session, timed, slot["cost"]))()
    session.archive()
    if session.runs("evidence", dry):
        session.as_part("evidence", lambda: evidence(session, slot["evidence"]))()
    session.archive()
    if session.runs("cuda-tests", dry or no_pytest):
        cuda = ["-m", "cuda", "-rs"]
        session.as_part(
            "cuda-tests", lambda: tests(session, "cuda-marked", "tests-cuda", cuda, slot["cuda-tests"])
        )()
    if session.runs("bench-line", dry):
        session.as_part("bench-line", lambda: bench_line(session, slot["bench-line"]))()


def memory(session: Session, until: float, workers: int) -> None:
    """Each workload plainly then under ``run`` (on the GPU), and simulated (on the CPU),
    the registry's first workloads first."""
    check, jobs = session.check, []
    for w in session.loads:
        if not session.dry:
            jobs.append(lambda w=w: (steps.plainly(check, w, until), steps.under_runner(check, w, until)))
        jobs.append(lambda w=w: steps.simulate(check, w, session.gpu, until))
    in_parallel(jobs, workers)


def tests(session: Session, title: str, name: str, args: list[str], until: float) -> None:
    """One pytest run, its line in the report's tests."""
    session.tests[title] = "running"
    session.tests[title] = steps.pytest_step(session.check, name, args, session.out, 600, until)


def cost(session: Session, timed: list[registry.Workload], until: float) -> None:
    """The runner's cost: ``--rounds`` rounds, each loop in turn within a round (so a cut
    leaves the loops equal rounds), the summary rewritten after each run pair."""
    rounds: dict[str, list[dict[str, Any]]] = {w.name: [] for w in timed}
    for index in range(session.args.rounds):
        for w in timed:
            rounds[w.name].append(steps.cost_round(session.check, w, index, until))
            session.cost = [
                report.cost_summary(t.name, t.entry.kind, t.entry.target, rounds[t.name]) for t in timed
            ]
            session.save()


def setup(session: Session, until: float) -> None:
    """What the machine has (and so dry mode, the simulated GPU and the report folder);
    with a GPU, probe beside the native build, then the runner's CUDA reader."""
    check, args = session.check, session.args
    outcome = check.run(
        "detect", [python(), "-c", DETECT, "pytest", "xdist", *registry.needed_modules()], ROOT, 120
    )
    found = re.search(r"^DETECT(.*)$", outcome.output, re.MULTILINE)
    env = (
        json.loads(found.group(1))
        if found
        else {"error": (outcome.output.strip().splitlines() or [outcome.status])[-1]}
    )
    env.setdefault("modules", {})
    session.env = env
    session.dry = (
        f"torch does not import: {env['error']}" if "error" in env
        else "--dry given" if args.dry else "" if env.get("cuda") else "no CUDA GPU visible to torch"
    )  # fmt: skip
    if not session.dry and not args.gpu:
        session.gpu = catalog_gpu(env["device_name"], env["total_memory"], env["capability"])
    session.label = f"dry-{session.gpu}" if session.dry else session.gpu
    session.out = args.out or ROOT / "reports" / "gpu_check" / re.sub(r"[^A-Za-z0-9.+-]+", "-", session.label)
    session.out.mkdir(parents=True, exist_ok=True)
    check.say(
        f"GPU: {env.get('device_name') or 'none'}; simulating {session.gpu}"
        + (f"; DRY MODE ({session.dry})" if session.dry else "")
        + f"; report in {session.out}"
    )
    if session.dry:
        return
    in_parallel(  # the native readers build (CPU) while probe measures the driver (GPU), alone on it
        [
            lambda: check.run("probe", [python(), "-m", "gpu_mem_track", "probe"], ROOT, 60, until),
            lambda: check.run(
                "native build", [python(), "-m", "gpu_mem_track.native.build"], ROOT, 120, until
            ),
        ],
        workers=2,
    )
    reader = check.run("native reader", [python(), "-c", READER], ROOT, 60, until)
    check.put("_native", "reader", reader.output.strip()[-2000:])


def prepare_workloads(session: Session) -> Path | None:
    """The registry's workloads that run here (``session.loads``) and, for every entry,
    its row (``session.entries``, with the reason when it is skipped); the prepared copy
    of nanoGPT's client when one is found and something needs it."""
    check, args = session.check, session.args
    wanted = [
        e
        for e in registry.REGISTRY
        if (not args.only_loads or e.name in args.only_loads) and e.name not in args.skip
    ]
    needs_nanogpt = any(e.home == registry.NANOGPT for e in wanted) or session.chosen("fit")
    copy, missing = None, f"no nanoGPT client found (give --fixtures DIR or set {ENV})"
    nanogpt = find_nanogpt(args.fixtures) if needs_nanogpt else None
    if nanogpt is not None:
        copy = check.tmp / "nanogpt"
        shutil.copytree(nanogpt, copy, ignore=shutil.ignore_patterns("data", "out*", "__pycache__"))
        made = check.run("nanoGPT make_data.py", [python(), "make_data.py"], copy, 90)
        if not made.ok:
            copy, missing = None, f"nanoGPT's make_data.py {made.status}{made.why}"
    session.loads, skipped = registry.resolve(
        wanted, ROOT, check.tmp, copy, missing, session.env.get("modules", {})
    )
    reasons = dict(skipped)
    session.entries = [
        {"name": e.name, "family": e.family, "skipped": reasons.get(e.name, "")} for e in wanted
    ]
    for name, why in skipped:
        check.skip(name, why)
    return copy


#: The evidence part's scripts: (step name, script, its arguments, seconds at most). Each
#: measures what the model has no recording of yet; its output goes to the report folder
#: (JSON lines) or to the runs' log (gpu_check_ranks prints its table).
EVIDENCE = (
    ("ranks (fake process group)", "scripts/gpu/gpu_check_ranks.py", ["--world-sizes", "2,4"], 150),
    ("convolution backends", "scripts/check/conv_backends.py", ["--out", "{out}/conv_backends.jsonl"], 120),
    ("compiled peaks", "scripts/check/compiled_peaks.py", ["--out", "{out}/compiled_peaks.jsonl"], 180),
)


def evidence(session: Session, until: float) -> None:
    """The scripts of :data:`EVIDENCE` on this GPU, one after the other, each within its
    seconds and the part's slot (what is not reached is named in the runs' log)."""
    for name, script, args, seconds in EVIDENCE:
        argv = [python(), script, "--gpu", session.gpu, *(a.format(out=session.out) for a in args)]
        session.check.run(name, argv, ROOT, seconds, until, gpu=True)


def bench_line(session: Session, until: float) -> None:
    """scripts/bench/bench_line.py on this GPU (3 rounds of half its default lines), its
    table kept for the report."""
    out = session.check.tmp / "bench_line.md"
    argv = [
        python(),
        "scripts/bench/bench_line.py",
        "--repeats",
        "3",
        "--iterations",
        "10000",
        "--out",
        str(out),
    ]
    session.check.run("bench_line", argv, ROOT, 120, until)
    session.bench = out.read_text() if out.is_file() else ""


if __name__ == "__main__":
    sys.exit(main())
