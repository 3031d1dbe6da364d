"""What gpu_check.py reads from its runs and how it writes them: pure functions, no I/O.

Reading: the per-iteration times a training script prints (nanoGPT's
``iter N: loss X, time Y ms``, which scripts/gpu/gpu_check_train.py prints too), their median
after warm-up, and pytest's closing summary line. Writing: the memory table (real,
runner, simulated and their differences), the timing table (runner against plain) and the
whole report as Markdown. Figures are bytes and milliseconds; a missing figure is ``None``
and prints as ``-`` with the reason in the notes.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

__all__ = [
    "iteration_times",
    "median_after_warmup",
    "memory_rows",
    "pytest_progress",
    "pytest_summary",
    "render_memory_table",
    "render_report",
    "render_timing_table",
]

_ITER = re.compile(r"^iter (\d+): loss [^,]*, time ([0-9.]+) ?ms", re.MULTILINE)
_PYTEST_END = re.compile(r"^=*\s*(?:\d+ \w+(?: \w+)?, )*\d+ \w+(?: \w+)? in [0-9.]+s.*$", re.MULTILINE)


def iteration_times(output: str) -> list[float]:
    """The per-iteration times (ms) in a script's output, in iteration order."""
    return [float(match.group(2)) for match in _ITER.finditer(output)]


def median_after_warmup(times: list[float], warmup: int) -> float | None:
    """The median of ``times`` without the first ``warmup`` (iteration 0 holds nanoGPT's
    evaluation and every first call's set-up); ``None`` when fewer than 3 remain."""
    kept = times[warmup:]
    return statistics.median(kept) if len(kept) >= 3 else None


def pytest_summary(output: str) -> str:
    """pytest's closing line (``991 passed, 10 failed in 147.67s``), or ``""``."""
    found = _PYTEST_END.findall(output)
    return found[-1].strip("= ").strip() if found else ""


def pytest_progress(output: str) -> str:
    """What pytest's ``-q`` progress lines show, for a run cut short before its summary."""
    marks = "".join(re.findall(r"^([.FEsxX]+)(?: +\[ *\d+%\])?$", output, re.MULTILINE))
    words = {".": "passed", "F": "failed", "E": "error", "s": "skipped"}
    counts = {word: marks.count(mark) for mark, word in words.items()}
    shown = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    return f"cut short, no summary; progress shows {shown or 'nothing'}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def _diff(value: int | float | None, base: int | float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{(value / base - 1) * 100:+.1f}%"


def memory_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per workload from its runs' figures: ``real`` (the wrapper's JSON),
    ``snapshot`` (the snapshot command's snapshot.json), ``runner`` and ``simulated``
    (run folders' meta.json); each may be missing."""
    rows = []
    for name, runs in results.items():
        real = runs.get("real") or {}
        snap = runs.get("snapshot") or {}
        runner = runs.get("runner") or {}
        sim = runs.get("simulated") or {}
        rows.append(
            {
                "workload": name,
                "real_allocated": real.get("max_memory_allocated"),
                "real_reserved": real.get("max_memory_reserved"),
                "snapshot_peak": (snap.get("peak") or {}).get("allocated"),
                "runner_peak": runner.get("peak"),
                "simulated_peak": sim.get("peak"),
                "simulated_reserved": sim.get("reserved_peak"),
                "simulated_stopped": (sim.get("stopped") or {}).get("reason"),
                "notes": "; ".join(runs.get("notes", [])),
            }
        )
    return rows


def render_memory_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of peaks (MiB) and differences from the real run's."""
    head = (
        "| workload | real max allocated | real max reserved | snapshot replay | runner peak | runner/real "
        "| simulated peak | sim/real | simulated reserved | sim reserved/real | notes |"
    )
    lines = [head, "|" + "---|" * 11]
    for row in rows:
        real = row["real_allocated"]
        cells = [
            row["workload"],
            _mib(real),
            _mib(row["real_reserved"]),
            _mib(row["snapshot_peak"])
            + (f" ({_diff(row['snapshot_peak'], real)})" if row["snapshot_peak"] else ""),
            _mib(row["runner_peak"]),
            _diff(row["runner_peak"], real),
            _mib(row["simulated_peak"]),
            _diff(row["simulated_peak"], real),
            _mib(row["simulated_reserved"]),
            _diff(row["simulated_reserved"], row["real_reserved"]),
            row["notes"] or "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_timing_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of median iteration times, plain against under ``run``."""
    lines = [
        "| loop | kind | plain median ms | runner median ms | runner / plain "
        "| runner, dict read (native off) ms | dict / plain | iterations (after warm-up) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        plain, runner, dict_read = row.get("plain_ms"), row.get("runner_ms"), row.get("dict_ms")
        cells = [
            row["workload"],
            row["kind"],
            "-" if plain is None else f"{plain:.2f}",
            "-" if runner is None else f"{runner:.2f}",
            f"{runner / plain:.3f}x" if plain and runner else "-",
            "-" if dict_read is None else f"{dict_read:.2f}",
            f"{dict_read / plain:.3f}x" if plain and dict_read else "-",
            f"{row.get('plain_n', 0)} / {row.get('runner_n', 0)} (warm-up {row.get('warmup', 0)})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _steps_table(steps: list[dict[str, Any]]) -> str:
    lines = ["| step | status | seconds | detail |", "|---|---|---|---|"]
    for step in steps:
        detail = str(step.get("detail", "")).replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {step['name']} | {step['status']} | {step.get('seconds', 0):.1f} | {detail} |")
    return "\n".join(lines) + "\n"


def render_report(data: dict[str, Any]) -> str:
    """The whole report.md from the report.json data."""
    env = data["environment"]
    out = [f"# GPU check: {data['gpu_label']}\n"]
    out.append(
        f"{data['started']} UTC, {data['seconds']:.0f} s of a {data['budget']:.0f} s budget. "
        f"Python {env.get('python', '?')}, torch {env.get('torch', 'not importable')}, "
        f"{env.get('device_name') or 'no GPU'}"
        + (
            f" ({env['total_memory']:,} B, compute capability {'.'.join(map(str, env['capability']))})"
            if env.get("total_memory")
            else ""
        )
        + f"; simulated as `{data['simulated_gpu']}`.\n"
    )
    if data.get("dry"):
        out.append(f"Dry mode: {data['dry']}. Only the simulated runs ran.\n")
    if data.get("failed"):
        out.append("Parts that failed (their output: runs.log, tests-*.log, probe.log):\n")
        out += [f"- {note}" for note in data["failed"]]
    if data.get("skipped"):
        out.append("\nSkipped:\n")
        out += [f"- {note}" for note in data["skipped"]]
    out.append("\n## Tests\n")
    for name, summary in data.get("tests", {}).items():
        out.append(f"- {name}: {summary}")
    if not data.get("tests"):
        out.append("Not run (see skipped).")
    out.append("\n## Memory (MiB; differences against the real run's max allocated / reserved)\n")
    out.append(render_memory_table(data["memory"]))
    out.append("\n## Runner cost (each script's own per-iteration times, medians after warm-up)\n")
    out.append(render_timing_table(data["timing"]))
    if data.get("fit"):
        from gpu_check_fit import render as render_fit

        out.append(render_fit(data["fit"]))
    if data.get("native"):
        out.append("\n## The runner's CUDA statistics reader\n\n```\n" + data["native"] + "\n```\n")
    if data.get("bench_line"):
        out.append("\n## bench_line on this GPU\n\n" + data["bench_line"].strip() + "\n")
    if data.get("probe"):
        out.append("\n## probe\n\n```\n" + data["probe"].strip() + "\n```\n")
    out.append("\n## Steps\n")
    out.append(_steps_table(data["steps"]))
    return "\n".join(out)
