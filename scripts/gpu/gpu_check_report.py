"""What the GPU check reads from its runs and how it writes them: pure functions, no I/O.

Reading: the per-iteration times a training script prints (nanoGPT's
``iter N: loss X, time Y ms``, which scripts/gpu/gpu_check_train.py prints too), their
median after warm-up, pytest's closing summary line, its ``-q`` progress marks (for a run
cut short) and its JUnit XML. Writing: the memory table (real against simulated peaks and
the error of each, the runner's and the snapshot replay's peaks beside them), the runner's
cost (its ratio to the plain run over several rounds: min, median, max, against issue 29's
target), the advisor's answer and its edge claims, the parts and steps, and the whole
report as Markdown. Figures are bytes and milliseconds; a missing figure is ``None`` and
prints as ``-`` with the reason in the notes. Nothing here imports another script.
"""

from __future__ import annotations

import json
import re
import statistics
import xml.etree.ElementTree as ET
from typing import Any

__all__ = [
    "cost_summary",
    "iteration_times",
    "junit_counts",
    "last_json",
    "median_after_warmup",
    "memory_rows",
    "pytest_progress",
    "pytest_summary",
    "render_cost_table",
    "render_edge",
    "render_fit",
    "render_memory_table",
    "render_report",
    "tests_line",
]

_ITER = re.compile(r"^iter (\d+): loss [^,]*, time ([0-9.]+) ?ms", re.MULTILINE)
_PYTEST_END = re.compile(r"^=*\s*(?:\d+ \w+(?: \w+)?, )*\d+ \w+(?: \w+)? in [0-9.]+s.*$", re.MULTILINE)
MIB = 2**20


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


def last_json(output: str) -> Any:
    """The JSON object a command printed last, after its progress lines (one starting a
    line), or ``None`` when there is none."""
    decoder = json.JSONDecoder()
    for match in reversed(list(re.finditer(r"^\{", output, re.MULTILINE))):
        try:
            return decoder.raw_decode(output, match.start())[0]
        except ValueError:
            continue
    return None


def junit_counts(text: str) -> dict[str, Any] | None:
    """The counts of a pytest JUnit XML (also the one an interrupted pytest writes):
    tests, passed, failed, errors, skipped, seconds, and the ids of the tests that failed
    or erred (``file.py::name`` as far as the XML tells); ``None`` when it does not parse."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        return None
    counts = {
        key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")
    }
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = (case.get("classname") or "").replace(".", "/")
            failed.append(f"{module}.py::{case.get('name')}" if module else str(case.get("name")))
    return {
        "tests": counts["tests"],
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "failed": counts["failures"],
        "errors": counts["errors"],
        "skipped": counts["skipped"],
        "seconds": round(sum(float(s.get("time", 0) or 0) for s in suites), 1),
        "failed_ids": failed,
    }


def tests_line(junit: dict[str, Any] | None, output: str, status: str) -> str:
    """One pytest run in a line: the JUnit XML's counts when there is one (an interrupted
    run writes one too), else pytest's summary line, else its progress marks; the step's
    status after it, then the tests that failed, one a line."""
    if junit:
        kinds = [(junit["passed"], "passed"), (junit["failed"], "failed"), (junit["errors"], "errors")]
        kinds.append((junit["skipped"], "skipped"))
        summary = ", ".join(f"{n} {word}" for n, word in kinds if n) or "no tests"
        summary += f" in {junit['seconds']:.0f} s (JUnit XML)"
        failed = junit["failed_ids"]
    else:
        summary = pytest_summary(output) or pytest_progress(output)
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return f"{summary} ({status})" + "".join(f"\n  - {name}" for name in failed)


def _mib(value: int | float | None) -> str:
    return "-" if value is None else f"{value / MIB:,.1f}"


def _error(value: int | float | None, truth: int | float | None) -> str:
    if value is None or not truth:
        return "-"
    return f"{(value / truth - 1) * 100:+.1f}%"


def memory_rows(results: dict[str, dict[str, Any]], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per registry entry (``entries``: name, family, and ``skipped`` with the
    reason when it did not run), from its runs' figures in ``results``: ``real`` (the
    wrapper's JSON), ``simulated`` and ``runner`` (run folders' meta.json), ``snapshot``
    (the snapshot command's snapshot.json); each may be missing."""
    rows = []
    for entry in entries:
        runs = results.get(entry["name"], {})
        real = runs.get("real") or {}
        snap = runs.get("snapshot") or {}
        sim = runs.get("simulated") or {}
        notes = list(runs.get("notes", []))
        if entry.get("skipped"):
            notes.insert(0, f"skipped: {entry['skipped']}")
        stopped = (sim.get("stopped") or {}).get("reason")
        if stopped and stopped != "steady":  # steady: the loop left once its memory repeated, as meant
            notes.append(f"simulation stopped: {stopped}")
        rows.append(
            {
                "workload": entry["name"],
                "family": entry.get("family", ""),
                "real_allocated": real.get("max_memory_allocated"),
                "real_reserved": real.get("max_memory_reserved"),
                "simulated_allocated": sim.get("peak"),
                "simulated_reserved": sim.get("reserved_peak"),
                "runner_peak": (runs.get("runner") or {}).get("peak"),
                "snapshot_peak": (snap.get("peak") or {}).get("allocated"),
                "notes": "; ".join(notes),
            }
        )
    return rows


def render_memory_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of peaks (MiB): the simulated against the real (max allocated,
    max reserved) with the error of each, then the runner's and the snapshot replay's."""
    lines = [
        "| workload | family | real max allocated | simulated | error | real max reserved | simulated "
        "| error | runner peak | snapshot replay | notes |",
        "|" + "---|" * 11,
    ]
    for row in rows:
        real = row["real_allocated"]
        beside = [
            _mib(value) + (f" ({_error(value, real)})" if value is not None and real else "")
            for value in (row["runner_peak"], row["snapshot_peak"])
        ]
        cells = [
            row["workload"],
            row["family"],
            _mib(real),
            _mib(row["simulated_allocated"]),
            _error(row["simulated_allocated"], real),
            _mib(row["real_reserved"]),
            _mib(row["simulated_reserved"]),
            _error(row["simulated_reserved"], row["real_reserved"]),
            *beside,
            row["notes"].replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cost_summary(name: str, kind: str, target: float | None, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A timed loop's rounds (each: plain_ms and runner_ms, the medians after warm-up of
    one plain run and one run under ``run``) summed up: the ratio runner/plain of each
    round that has both, its min, median and max, and whether the median meets ``target``."""
    ratios = [r["runner_ms"] / r["plain_ms"] for r in rounds if r.get("plain_ms") and r.get("runner_ms")]
    plain = [r["plain_ms"] for r in rounds if r.get("plain_ms")]
    runner = [r["runner_ms"] for r in rounds if r.get("runner_ms")]
    median = statistics.median(ratios) if ratios else None
    return {
        "workload": name,
        "kind": kind,
        "target": target,
        "rounds": rounds,
        "ratios": [round(r, 4) for r in ratios],
        "ratio_min": min(ratios) if ratios else None,
        "ratio_median": median,
        "ratio_max": max(ratios) if ratios else None,
        "plain_ms": statistics.median(plain) if plain else None,
        "runner_ms": statistics.median(runner) if runner else None,
        "meets_target": None if median is None or target is None else median <= target,
    }


def render_cost_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the runner's cost: per timed loop, the ratio of its median
    iteration time under ``run`` to the plain one, over the rounds (min / median / max)."""
    lines = [
        "| loop | kind | target | rounds with both | plain median ms | runner median ms "
        "| runner / plain: min | median | max | meets target |",
        "|" + "---|" * 10,
    ]
    for row in rows:
        ratio = {k: row.get(f"ratio_{k}") for k in ("min", "median", "max")}
        meets = {True: "yes", False: "**no**", None: "-"}[row.get("meets_target")]
        cells = [
            row["workload"],
            row["kind"],
            "-" if row.get("target") is None else f"<= {row['target']:.2f}x",
            f"{len(row.get('ratios', []))} of {len(row.get('rounds', []))}",
            "-" if row.get("plain_ms") is None else f"{row['plain_ms']:.2f}",
            "-" if row.get("runner_ms") is None else f"{row['runner_ms']:.2f}",
            *("-" if ratio[k] is None else f"{ratio[k]:.3f}x" for k in ("min", "median", "max")),
            meets,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_fit(fit: dict[str, Any]) -> str:
    """The advisor's answer (simulated, on the CPU): its verdict and rows."""
    answer = fit.get("answer")
    if not answer:
        return "\n".join(f"- {note}" for note in fit.get("notes", ["not run"])) + "\n"
    out = [
        f"`{fit.get('command', 'fit')}`: {answer.get('verdict')}, recommended "
        f"{answer.get('recommended') or '-'}, {answer.get('trials')} trials in "
        f"{answer.get('seconds', 0):.0f} s; capacity {_mib(answer.get('capacity'))} MiB.",
        "",
        "| row | fits | peak reserved MiB | largest batch | its reserved MiB |",
        "|---|---|---|---|---|",
    ]
    for row in answer.get("rows", []):
        best = row.get("batch") or {}
        out.append(
            f"| {row.get('label')} | {row.get('fits')} | {_mib(row.get('reserved_peak'))} | "
            f"{best.get('batch', '-')} | {_mib(best.get('reserved_peak'))} |"
        )
    return "\n".join(out) + "\n"


def render_edge(edge: dict[str, Any]) -> str:
    """The edge claims' record, as scripts/gpu/gpu_check_edge.py returns it: its
    ``markdown`` when it gives one, else its ``rows`` as a table and its other fields as a
    list; the reason when the step did not run."""
    record = edge.get("record")
    if not record:
        return "\n".join(f"- {note}" for note in edge.get("notes", ["not run"])) + "\n"
    if isinstance(record, dict) and isinstance(record.get("markdown"), str):
        return record["markdown"].strip() + "\n"
    rows = record.get("rows") if isinstance(record, dict) else None
    out = [
        f"- {key}: {value}"
        for key, value in (record.items() if isinstance(record, dict) else [("record", record)])
        if key != "rows"
    ]
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        keys = list(dict.fromkeys(k for r in rows for k in r))
        out += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(str(r.get(k, "-")).replace("|", "/") for k in keys) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [
        "| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in row) + " |" for row in rows
    ]
    return "\n".join(lines) + "\n"


def render_report(data: dict[str, Any]) -> str:
    """The whole report.md from the report.json data (also part-way through a check)."""
    env = data["environment"]
    out = [f"# GPU check: {data['gpu_label']}\n"]
    state = "finished" if data.get("finished") else "in progress (written as each step ends)"
    out.append(
        f"{data['started']} UTC, {data['seconds']:.0f} s of a {data['budget']:.0f} s budget, {state}. "
        f"`{data.get('command', '')}`. Python {env.get('python', '?')}, torch "
        f"{env.get('torch', 'not importable')}, {env.get('device_name') or 'no GPU'}"
        + (
            f" ({env['total_memory']:,} B, compute capability {'.'.join(map(str, env['capability']))})"
            if env.get("total_memory")
            else ""
        )
        + f"; simulated as `{data['simulated_gpu']}`.\n"
    )
    if data.get("dry"):
        out.append(f"Dry mode: {data['dry']}. Only the simulated parts ran.\n")
    if data.get("failed"):
        out.append("Steps that failed (their output: runs.log, tests-*.log, probe.log):\n")
        out += [f"- {note}" for note in data["failed"]]
    if data.get("skipped"):
        out.append("\nSkipped:\n")
        out += [f"- {note}" for note in data["skipped"]]
    out.append("\n## Parts, in the order they run, and their slots\n")
    parts = data.get("parts", [])
    out.append(
        _table(
            ["part", "what", "slot ends at s", "status", "seconds"],
            [
                [p["name"], p["what"], f"{p['slot_end']:.0f}", p["status"], f"{p.get('seconds') or 0:.1f}"]
                for p in parts
            ],
        )
    )
    out.append(
        "\n## Memory: simulated against real (MiB; error = simulated / real - 1; the runner's "
        "and the snapshot replay's peaks against the real max allocated)\n"
    )
    out.append(render_memory_table(data["memory"]))
    out.append("\n## The runner's cost (each loop's own iteration times, medians after warm-up, per round)\n")
    out.append(render_cost_table(data["cost"]) if data.get("cost") else "Not run (see the parts).\n")
    out.append("\n## Fit: the advisor (simulated)\n")
    out.append(render_fit(data.get("fit", {})))
    out.append("\n## Fit's edge claims on this GPU (scripts/gpu/gpu_check_edge.py)\n")
    out.append(render_edge(data.get("edge", {})))
    out.append("\n## Tests\n")
    for name, summary in data.get("tests", {}).items():
        out.append(f"- {name}: {summary}")
    if not data.get("tests"):
        out.append("Not run (see the parts).")
    if data.get("native"):
        out.append("\n## The runner's CUDA statistics reader\n\n```\n" + data["native"] + "\n```\n")
    if data.get("bench_line"):
        out.append("\n## bench_line on this GPU\n\n" + data["bench_line"].strip() + "\n")
    if data.get("probe"):
        out.append("\n## probe\n\n```\n" + data["probe"].strip() + "\n```\n")
    out.append("\n## Steps\n")
    out.append(
        _table(
            ["step", "status", "seconds", "detail"],
            [
                [s["name"], s["status"], f"{s.get('seconds', 0):.1f}", str(s.get("detail", ""))[:200]]
                for s in data["steps"]
            ],
        )
    )
    return "\n".join(out)
