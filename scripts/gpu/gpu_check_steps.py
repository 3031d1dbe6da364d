"""The GPU check's steps on a workload, and its pytest runs: what each runs and what it keeps.

Per workload (scripts/gpu/gpu_check_workloads.py), in ``Check.results[name]``: ``real``
(the plain run's JSON, written by scripts/gpu/gpu_check_wrap.py), ``snapshot`` (that run's
snapshot replayed by the ``snapshot`` command), ``simulated`` and ``runner`` (the run
folders' meta.json of ``run --simulate GPU`` and of ``run``), ``cost`` (the timed rounds)
and ``notes`` (the steps that failed). The runs on the GPU take a GPU place of ``Check``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gpu_check_report as report
from gpu_check_clock import ROOT, Check, Outcome, python, read_json
from gpu_check_workloads import Workload

WRAP = ROOT / "scripts" / "gpu" / "gpu_check_wrap.py"
#: Iterations left out of the medians (iteration 0 holds nanoGPT's evaluation and first calls).
WARMUP = 5
#: Seconds a single run may take (the part's slot may end it sooner).
RUN_TIMEOUT = 180


def simulate(check: Check, w: Workload, gpu: str, until: float) -> None:
    """``run --simulate GPU`` (on the CPU): the run folder's meta.json as ``simulated``."""
    argv = [python(), "-m", "gpu_mem_track", "run", "--simulate", gpu, "--out-dir", str(check.tmp / "runs")]
    outcome = check.run(
        f"{w.name} simulated", [*argv, "--run-name", f"{w.name}-sim", *w.argv], w.cwd, RUN_TIMEOUT, until
    )
    meta = read_json(check.tmp / "runs" / f"{w.name}-sim" / "meta.json")
    if meta:
        check.put(w.name, "simulated", meta)
    if not outcome.ok:
        check.note(w.name, f"simulated run {outcome.status}{outcome.why}")


def under_runner(check: Check, w: Workload, until: float) -> None:
    """``run`` on the GPU: the run folder's meta.json as ``runner``."""
    argv = [python(), "-m", "gpu_mem_track", "run", "--out-dir", str(check.tmp / "runs")]
    outcome = check.run(
        f"{w.name} runner",
        [*argv, "--run-name", f"{w.name}-runner", *w.argv],
        w.cwd,
        RUN_TIMEOUT,
        until,
        gpu=True,
    )
    meta = read_json(check.tmp / "runs" / f"{w.name}-runner" / "meta.json")
    if meta:
        check.put(w.name, "runner", meta)
    if not outcome.ok:
        check.note(w.name, f"runner {outcome.status}{outcome.why}")


def plainly(check: Check, w: Workload, until: float) -> None:
    """The plain run through the wrapper, recording a snapshot, as ``real``; then that
    snapshot replayed by the ``snapshot`` command (its snapshot.json as ``snapshot``)."""
    figures, pickle = check.tmp / f"{w.name}-plain.json", check.tmp / f"{w.name}.pickle"
    argv = [python(), str(WRAP), str(figures), str(pickle), *w.argv]
    outcome = check.run(f"{w.name} plain", argv, w.cwd, RUN_TIMEOUT, until, gpu=True)
    real = read_json(figures)
    if real:
        check.put(w.name, "real", real)
    if not outcome.ok:
        check.note(w.name, f"plain run {outcome.status}{outcome.why}")
    if not pickle.is_file():
        return
    argv = [
        python(),
        "-m",
        "gpu_mem_track",
        "snapshot",
        "--out-dir",
        str(check.tmp / "snap"),
        "--name",
        w.name,
    ]
    replay = check.run(f"{w.name} snapshot replay", [*argv, str(pickle)], check.tmp, 90, until)
    summary = read_json(check.tmp / "snap" / w.name / "snapshot.json")
    if summary:
        keep = ("entries", "peak", "max_reserved", "segments_allocated", "check")
        check.put(w.name, "snapshot", {k: summary.get(k) for k in keep})
    if not replay.ok:
        check.note(w.name, f"snapshot replay {replay.status}{replay.why}")
    pickle.unlink(missing_ok=True)


def cost_round(check: Check, w: Workload, index: int, until: float) -> dict[str, Any]:
    """One round of the runner's cost: the loop plainly (``python SCRIPT ARGS``) and under
    ``run``, alone on the machine, in turns (plain first in even rounds, so a drift of the
    machine falls on both); each run's median iteration time after warm-up."""
    modes = ["plain", "runner"] if index % 2 == 0 else ["runner", "plain"]
    out: dict[str, Any] = {"round": index + 1, "order": "/".join(modes)}
    for mode in modes:
        argv = [python(), *w.argv]
        if mode == "runner":
            runs = str(check.tmp / "cost-runs")
            argv = [
                python(),
                "-m",
                "gpu_mem_track",
                "run",
                "--out-dir",
                runs,
                "--run-name",
                f"{w.name}-{index}",
                *w.argv,
            ]
        outcome = check.run(
            f"{w.name} cost round {index + 1} {mode}", argv, w.cwd, RUN_TIMEOUT, until, gpu=True
        )
        times = report.iteration_times(outcome.output)
        out[f"{mode}_ms"] = report.median_after_warmup(times, WARMUP)
        out[f"{mode}_n"] = max(len(times) - WARMUP, 0)
        out[f"{mode}_status"] = outcome.status
    return out


def pytest_step(check: Check, name: str, args: list[str], out: Path, timeout: float, until: float) -> str:
    """pytest quietly, with its JUnit XML at ``out/<name>.xml`` (pytest writes it also when
    interrupted, which ``Check.run`` does first at the slot's end) and its output at
    ``out/<name>.log``; its one-line summary and the tests that failed."""
    xml = out / f"{name}.xml"
    argv = [python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args]
    outcome: Outcome = check.run(name, argv, ROOT, timeout, until, grace=20)
    (out / f"{name}.log").write_text(outcome.output[-2_000_000:])
    text = xml.read_text(errors="replace") if xml.is_file() else ""
    return report.tests_line(report.junit_counts(text) if text else None, outcome.output, outcome.status)
