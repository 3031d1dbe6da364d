"""Check ``run --simulate h200`` against the H200 recordings of nanoGPT.

For each recorded nanoGPT configuration (``real/<name>.json`` gives the script's
arguments and the GPU's figures; ``<name>.pickle.gz`` its trace with Python stacks) in
the H200 fixture folder (``--fixtures``, else ``shared/fixtures/h200`` beside the
checkout or one level up), this copies the test client (``clients/nanogpt``) to a
temporary folder, runs its ``make_data.py`` there, and runs its ``train.py`` unmodified
with the recorded arguments, twice, in a subprocess:

- ``python -m gpu_mem_track run --simulate h200 --snapshot``: what a user gets (the run
  stops once its loop's memory is steady). Its peak allocated and reserved are compared
  with ``max_memory_allocated()`` and ``max_memory_reserved()`` of the GPU (targets:
  within 0.5% and 1%), with the time it took;
- the same with ``--run-to-end``, so that both traces hold the same iterations: its
  snapshot is compared with the recording line by line.

Per line of the script's files (a trace entry without Python frames, as autograd's
backward allocations are on a GPU, belongs to the line of the entry before it, which is
the line that called ``backward()``): how many allocations of each size each trace made,
and which blocks (requests rounded to 512 B) each held at its peak allocated (the
replayed peak of the trace). Rows list where the two differ, largest byte difference
first.

Writes ``reports/h200_check.md`` (``--out``) and a ``.json`` beside it. Exit code 1 when a
target is missed.

    python scripts/check/check_h200.py [--fixtures DIR] [--out reports/h200_check.md] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the package, and scripts/_common

from _common.fixtures import h200_folder, shown  # noqa: E402
from _common.simulated import run_simulated  # noqa: E402

from gpu_mem_track.allocator.replay import replay  # noqa: E402
from gpu_mem_track.snapshotfile.load import load_snapshot  # noqa: E402
from gpu_mem_track.snapshotfile.records import Frame, TraceEntry  # noqa: E402
from gpu_mem_track.units import format_bytes  # noqa: E402

CONFIGS = ("nanogpt-char", "nanogpt-gpt2-bf16")
CLIENT = "clients/nanogpt"
TARGETS = {"allocated": 0.005, "reserved": 0.01}
ROWS = 12


def prepare_client(fixtures: Path, work: Path) -> Path:
    """A writable copy of the client with its data files made."""
    client = work / "nanogpt"
    shutil.copytree(fixtures / CLIENT, client)
    for path in client.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    subprocess.run([sys.executable, "make_data.py"], cwd=client, check=True, capture_output=True, timeout=600)
    return client


def simulate(client: Path, argv: list[str], name: str, to_end: bool) -> dict:
    """One ``run --simulate h200 --snapshot`` of the recorded command; its figures."""
    args = ["--simulate", "h200", "--snapshot", "--snapshot-entries", "10000000"]
    args += ["--out-dir", "runs", "--run-name", name, *(["--run-to-end"] if to_end else []), *argv]
    _, seconds = run_simulated(args, client, 3600, f"{name}: the simulated run", tail=4000)
    folder = client / "runs" / name
    meta = json.loads((folder / "meta.json").read_text())
    return {
        "seconds": round(seconds, 1),
        "allocated": int(meta["peak"]),
        "reserved": int(meta["reserved_peak"]),
        "stopped": meta.get("stopped"),
        "snapshot": folder / "snapshot.pickle",
    }


def script_line(frames: tuple[Frame, ...], names: set[str]) -> str | None:
    """``file:line`` of the innermost frame in one of the client's files."""
    for frame in frames:
        base = os.path.basename(frame.filename)
        if base in names:
            return f"{base}:{frame.line}"
    return None


def attributed(trace: tuple[TraceEntry, ...], names: set[str]) -> list[tuple[int, TraceEntry, str]]:
    """Each allocation or completed free with its index and line (see the module doc)."""
    out, last = [], "(before the script)"
    for index, entry in enumerate(trace):
        last = script_line(entry.frames, names) or last
        if entry.action in ("alloc", "free_completed"):
            out.append((index, entry, last))
    return out


def held_at_peak(path: Path, names: set[str]) -> tuple[int, Counter]:
    """The trace's replayed peak allocated, and the blocks live then by (line, size)."""
    snapshot = load_snapshot(path)
    result = replay(snapshot, 0)
    peak = max(result.steps, key=lambda step: step.allocated)
    live: dict[int, tuple[str, int]] = {}
    for index, entry, line in attributed(snapshot.device_trace(0), names):
        if index > peak.index:
            break
        if entry.action == "alloc":
            live[entry.addr] = (line, -(-max(entry.size, 1) // 512) * 512)
        else:
            live.pop(entry.addr, None)
    return peak.allocated, Counter(live.values())


def allocations(path: Path, names: set[str]) -> Counter:
    """How many allocations of each request size each line made."""
    trace = load_snapshot(path).device_trace(0)
    return Counter((line, e.size) for _, e, line in attributed(trace, names) if e.action == "alloc")


def differences(simulated: Counter, recorded: Counter) -> list[dict]:
    """(line, size) rows whose counts differ, largest byte difference first."""
    rows = [
        {"line": line, "size": size, "simulated": simulated[key], "recorded": recorded[key]}
        for key in set(simulated) | set(recorded)
        for line, size in [key]
        if simulated[key] != recorded[key]
    ]
    for row in rows:
        row["bytes"] = (row["simulated"] - row["recorded"]) * row["size"]
    return sorted(rows, key=lambda row: (-abs(row["bytes"]), row["line"], row["size"]))


def check(fixtures: Path, name: str, client: Path) -> dict:
    real = json.loads((fixtures / "real" / f"{name}.json").read_text())
    argv = list(real["argv"])
    names = {p.name for p in client.glob("*.py")}
    steady = simulate(client, argv, name, to_end=False)
    full = simulate(client, argv, name + "-to-end", to_end=True)
    recording = fixtures / f"{name}.pickle.gz"
    sim_peak, sim_held = held_at_peak(full["snapshot"], names)
    rec_peak, rec_held = held_at_peak(recording, names)
    result = {
        "name": name,
        "argv": argv,
        "recorded": {
            "allocated": real["max_allocated"],
            "reserved": real["max_reserved"],
            "torch": real["torch"],
        },
        "simulated": {k: v for k, v in steady.items() if k != "snapshot"},
        "to_end": {k: v for k, v in full.items() if k != "snapshot"},
        "trace_peaks": {"simulated": sim_peak, "recorded": rec_peak},
        "allocations": differences(allocations(full["snapshot"], names), allocations(recording, names)),
        "held": differences(sim_held, rec_held),
    }
    for key in ("allocated", "reserved"):
        error = steady[key] / real[f"max_{key}"] - 1
        result[f"{key}_error"] = error
        result[f"{key}_ok"] = abs(error) <= TARGETS[key]
    return result


def table(rows: list[dict], what: str) -> list[str]:
    if not rows:
        return [f"No difference: every line {what} the same sizes, as many times.", ""]
    out = [
        "| line | request size | simulated | recorded | bytes (simulated - recorded) |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows[:ROWS]:
        out.append(
            f"| {row['line']} | {row['size']:,} | {row['simulated']} | {row['recorded']} "
            f"| {row['bytes']:+,} |"
        )
    if len(rows) > ROWS:
        out.append(f"| ({len(rows) - ROWS} more rows, in the .json) | | | | |")
    return out + [""]


def render(results: list[dict], fixtures: Path) -> str:
    out = [
        "# `run --simulate h200` against the H200 nanoGPT recordings",
        "",
        f"Written by `python scripts/check/check_h200.py` (fixtures: `{shown(fixtures)}/`; their README",
        "gives the machine and the commands). The recordings ran torch "
        + ", ".join(sorted({r["recorded"]["torch"] for r in results}))
        + f" on the GPU; the simulation ran torch {torch_version()} here, on the",
        "unmodified `train.py` with the recorded arguments. Targets: peak allocated within 0.5%, peak",
        "reserved within 1%.",
        "",
        "| configuration | GPU allocated | simulated | error | GPU reserved | simulated | error | time "
        "| run to end: allocated, reserved, time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        rec, sim, end = r["recorded"], r["simulated"], r["to_end"]
        out.append(
            f"| {r['name']} | {rec['allocated']:,} | {sim['allocated']:,} | {r['allocated_error']:+.3%} "
            f"| {rec['reserved']:,} | {sim['reserved']:,} | {r['reserved_error']:+.3%} | {sim['seconds']} s "
            f"| {end['allocated']:,}, {end['reserved']:,}, {end['seconds']} s |"
        )
    out += [
        "",
        "Time: wall-clock seconds of the whole `run --simulate` subprocess (Python start, imports, the",
        "script's own setup), on a shared 2-core machine. The first run stops when its loop's memory is",
        "steady (what a user gets); the second runs every iteration, as the GPU did, and gives the traces",
        "compared below.",
        "",
    ]
    for r in results:
        peaks = r["trace_peaks"]
        out += [
            f"## {r['name']}",
            "",
            f"`train.py {' '.join(r['argv'][1:])}`",
            "",
            f"Replayed trace peaks: simulated {peaks['simulated']:,} B, recorded {peaks['recorded']:,} B "
            f"({format_bytes(peaks['simulated'] - peaks['recorded'], signed=True)}).",
            "",
            "Blocks held at the peak, by line and request size (rounded to 512 B), where they differ:",
            "",
            *table(r["held"], "held"),
            "Allocations over the whole run, by line and request size, where the counts differ",
            "(frameless entries belong to the line before them: backward's to the `backward()` line):",
            "",
            *table(r["allocations"], "allocated"),
        ]
    return "\n".join(out)


def torch_version() -> str:
    import torch

    return torch.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, help="the H200 fixture folder")
    parser.add_argument("--out", type=Path, default=ROOT / "reports/h200_check.md")
    parser.add_argument("--only", choices=CONFIGS, action="append", help="check only this configuration")
    args = parser.parse_args(argv)
    try:
        fixtures = h200_folder(args.fixtures, [CLIENT])
    except SystemExit as error:  # a folder given or found without the recording: exit 2
        parser.error(str(error))
    results = []
    with tempfile.TemporaryDirectory(prefix="check_h200_") as work:
        client = prepare_client(fixtures, Path(work))
        for name in args.only or CONFIGS:
            results.append(check(fixtures, name, client))
            done = results[-1]
            print(f"{name}: allocated {done['allocated_error']:+.3%}, reserved {done['reserved_error']:+.3%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(results, fixtures) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {shown(args.out)}")
    return 0 if all(r["allocated_ok"] and r["reserved_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
