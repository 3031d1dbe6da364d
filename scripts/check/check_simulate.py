"""Check ``run --simulate`` against GPU truth: the shared fixture's recorded 2.7B step.

Runs ``scripts/check/fixture_train_step.py`` (the recording's training script, as its author
ran it) unchanged under ``python -m gpu_mem_track run --simulate H100-80GB`` (the
recording's GPU: Hopper, 80 GB, 32 MiB cuBLAS workspaces) in a subprocess, then compares
with the recording ``transformer-2.7b-ctx128-train-step.pickle.gz`` (folder:
``--fixtures``, else ``$GPU_MEM_TRACK_SNAPSHOTS``, else ``shared/fixtures/snapshots``
beside the checkout or one level up):

- peak allocated: the run report's peak against the recording's replayed peak (target
  within 0.5%);
- peak reserved: the run's reserved peak against the recording's highest reserved during
  its trace (target within 1%);
- the script's own printed ``max_memory_allocated()`` equals the report's peak;
- the snapshot the script dumped under the simulation replays through
  ``scripts/check/check_allocator.py``'s check (every decision matched);
- block by block, where the two differ: the state at the trace's start, the blocks live
  at the end (requests and block sizes), allocations by phase and size, segments.

Writes reports/simulate_check.md and .json (``--out``). Exit code 1 when a target is
missed.

    python scripts/check/check_simulate.py [--fixtures DIR] [--out reports/simulate_check.md]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the package, and scripts/_common

from _common.fixtures import fixtures_folder  # noqa: E402
from _common.simulated import run_simulated  # noqa: E402

from gpu_mem_track.allocator.replay import replay  # noqa: E402
from gpu_mem_track.snapshotfile.load import load_snapshot  # noqa: E402
from gpu_mem_track.units import format_bytes  # noqa: E402

FIXTURE = "transformer-2.7b-ctx128-train-step.pickle.gz"
GPU = "H100-80GB"
DUMPED = "memory_ctx128_fullstep_.pickle"
TARGETS = {"allocated": 0.005, "reserved": 0.01}


def simulate(work: Path) -> dict:
    """Run the fixture script under ``run --simulate``; what it printed and the run folder."""
    args = [
        "--simulate",
        GPU,
        "--out-dir",
        str(work / "runs"),
        "--run-name",
        "fixture",
        str(ROOT / "scripts/check/fixture_train_step.py"),
        "--snapshots",
        str(work / "snapshots"),
    ]
    done, seconds = run_simulated(args, work, 1800)
    printed = [int(n) for n in re.findall(r"full step: max_memory_allocated (\d+) B", done.stdout)]
    folder = work / "runs" / "fixture"
    meta = json.loads((folder / "meta.json").read_text())
    with (folder / "lines.csv").open(newline="") as handle:
        lines = list(csv.DictReader(handle))
    return {
        "seconds": seconds,
        "printed": printed,
        "meta": meta,
        "lines": lines,
        "reserved_before_empty_cache": reserved_before_empty_cache(folder / "timeline.csv"),
    }


def reserved_before_empty_cache(timeline: Path) -> int | None:
    """The simulated allocator's reserved bytes just before the recorded step's
    ``empty_cache()`` (the session's fourth), from the run's timeline."""
    script = ROOT / "scripts/check/fixture_train_step.py"
    source = script.read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.strip() == "torch.cuda.empty_cache()")
    previous, seen = None, 0
    with timeline.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["event"] == "line" and row["line"] == str(line) and row["file"] == str(script):
                seen += 1
                if seen == 4:
                    return previous
            if row["reserved"]:
                previous = int(row["reserved"])
    return None


def replayed(path: Path) -> dict:
    """The trace's replay: start, peak, end, highest reserved."""
    snapshot = load_snapshot(path)
    result = replay(snapshot, 0)
    peak = max(result.steps, key=lambda step: step.allocated)
    return {
        "snapshot": snapshot,
        "start_allocated": result.start_allocated,
        "start_reserved": result.start_reserved,
        "peak_allocated": peak.allocated,
        "peak_index": peak.index,
        "peak_reserved": max(step.reserved for step in result.steps),
        "final_allocated": result.final_allocated,
        "final_reserved": result.final_reserved,
        "start_blocks": Counter(size for _, size in result.start_blocks),
        "entries": len(snapshot.device_traces[0]),
    }


def allocator_check(path: Path) -> dict:
    """``scripts/check/check_allocator.py``'s check of one snapshot (its report left as it is)."""
    spec = importlib.util.spec_from_file_location(
        "check_allocator", ROOT / "scripts/check/check_allocator.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.check(path)
    return {"rule_violations": len(result["rule_violations"]), **result.get("replay", {})}


def phase(entry, recorded: bool) -> str:
    """forward, backward or optimizer, from an ``alloc``'s stack (the recording's backward
    runs in autograd's C++ thread: no Python frames; the simulation's under
    ``_engine_run_backward``)."""
    frames = entry.frames or ()
    names = " ".join(f.name for f in frames)
    python = [f for f in frames if f.filename.endswith(".py") and "/torch/" not in f.filename]
    if any(f.name == "step" for f in python):
        return "optimizer"
    if recorded:
        ours = [f for f in python if "einops" not in f.filename]
        return "forward" if ours and "Backward" not in names and "backward" not in names else "backward"
    return "backward" if "_engine_run_backward" in names else "forward"


def blocks(snapshot) -> tuple[Counter, Counter, Counter]:
    """Live blocks at the end by size and by request; segments by size."""
    sizes, requests, segments = Counter(), Counter(), Counter()
    for segment in snapshot.device_segments(0):
        segments[segment.total_size] += 1
        for block in segment.blocks:
            if block.state == "active_allocated":
                sizes[block.size] += 1
                requests[block.requested_size] += 1
    return sizes, requests, segments


def differences(recorded: dict, simulated: dict) -> dict:
    """Block by block: what only one side has (``{size: count}``)."""
    rec, sim = recorded["snapshot"], simulated["snapshot"]
    (rec_sizes, rec_requests, rec_segments), (sim_sizes, sim_requests, sim_segments) = (
        blocks(rec),
        blocks(sim),
    )
    out = {
        "start_blocks": _both(recorded["start_blocks"], simulated["start_blocks"]),
        "end_block_sizes": _both(rec_sizes, sim_sizes),
        "end_requests": _both(rec_requests, sim_requests),
        "end_segments": _both(rec_segments, sim_segments),
        "segment_frees": {
            "recorded": sum(e.action == "segment_free" for e in rec.device_traces[0]),
            "simulated": sum(e.action == "segment_free" for e in sim.device_traces[0]),
        },
    }
    for name in ("forward", "backward", "optimizer"):
        a = Counter(e.size for e in rec.device_traces[0] if e.action == "alloc" and phase(e, True) == name)
        b = Counter(e.size for e in sim.device_traces[0] if e.action == "alloc" and phase(e, False) == name)
        out[f"allocs_{name}"] = {"recorded": sum(a.values()), "simulated": sum(b.values()), **_both(a, b)}
    return out


def _both(recorded: Counter, simulated: Counter) -> dict:
    return {
        "only_recorded": dict(sorted((recorded - simulated).items())),
        "only_simulated": dict(sorted((simulated - recorded).items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fixtures", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "reports/simulate_check.md")
    args = parser.parse_args(argv)
    fixture = fixtures_folder(args.fixtures) / FIXTURE
    if not fixture.is_file():
        raise SystemExit(f"no {FIXTURE} in {fixture.parent}")
    with tempfile.TemporaryDirectory(prefix="gmt-simulate-") as temp:
        work = Path(temp)
        run = simulate(work)
        dumped = work / "snapshots" / DUMPED
        simulated = replayed(dumped)
        check = allocator_check(dumped)
    recorded = replayed(fixture)
    result = compare(run, recorded, simulated, check)
    args.out.write_text(markdown(result))
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'all targets met' if result['passed'] else 'TARGET MISSED'}: see {args.out}")
    return 0 if result["passed"] else 1


def compare(run: dict, recorded: dict, simulated: dict, check: dict) -> dict:
    meta = run["meta"]
    peak, reserved = meta["peak"], meta["reserved_peak"]
    figures = {
        "allocated": {"simulated": peak, "recorded": recorded["peak_allocated"]},
        "reserved": {"simulated": reserved, "recorded": recorded["peak_reserved"]},
    }
    for name, pair in figures.items():
        pair["error"] = (pair["simulated"] - pair["recorded"]) / pair["recorded"]
        pair["target"] = TARGETS[name]
        pair["met"] = abs(pair["error"]) <= TARGETS[name]
    printed = run["printed"][-1] if run["printed"] else None
    side = {k: v for k, v in simulated.items() if k not in ("snapshot", "start_blocks")}
    truth = {k: v for k, v in recorded.items() if k not in ("snapshot", "start_blocks")}
    passed = (
        all(pair["met"] for pair in figures.values())
        and printed == peak
        and bool(check.get("all_match"))
        and not check["rule_violations"]
    )
    return {
        "command": "python scripts/check/check_simulate.py",
        "gpu": GPU,
        "fixture": FIXTURE,
        "seconds": round(run["seconds"], 1),
        "passed": passed,
        "figures": figures,
        "printed_max_memory_allocated": printed,
        "report_peak": peak,
        "report_peak_at": _short(meta["peak_at"]),
        "simulated_trace": side,
        "recorded_trace": truth,
        "allocator_check": {
            k: check.get(k) for k in ("all_match", "allocs", "segment_allocs", "final_blocks")
        }
        | {"rule_violations": check["rule_violations"], "peak_allocated": check.get("peak_allocated")},
        "reserved_before_empty_cache": run["reserved_before_empty_cache"],
        "differences": differences(recorded, simulated),
    }


def markdown(r: dict) -> str:
    a, res = r["figures"]["allocated"], r["figures"]["reserved"]
    rec, sim, diff = r["recorded_trace"], r["simulated_trace"], r["differences"]
    check = r["allocator_check"]
    out = [
        "# `run --simulate` against a recorded GPU step",
        "",
        f"`{r['command']}`: `scripts/check/fixture_train_step.py` (the training script of the shared fixture "
        f"`{r['fixture']}`, as its author ran it) run unchanged under "
        f"`python -m gpu_mem_track run --simulate {r['gpu']}` ({r['seconds']} s here, no GPU), compared "
        "with the recording (replayed from its trace).",
        "",
        f"**{'All targets met.' if r['passed'] else 'A target was missed.'}**",
        "",
        "| figure | simulated | recorded | error | target |",
        "|---|---:|---:|---:|---:|",
        _row("peak allocated", a),
        _row("peak reserved (during the recorded step)", res),
        "",
        f"- The script's own `torch.cuda.max_memory_allocated()` after the step printed "
        f"{r['printed_max_memory_allocated']:,} B; the run report's peak is {r['report_peak']:,} B "
        f"({'equal' if r['printed_max_memory_allocated'] == r['report_peak'] else 'DIFFERENT'}), at "
        f"`{_short(r['report_peak_at'])}`.",
        f"- The snapshot the script dumped (`torch.cuda.memory._dump_snapshot`) under the simulation replays "
        f"through `scripts/check/check_allocator.py`'s check: allocs {_frac(check['allocs'])}, "
        f"segment allocs {_frac(check['segment_allocs'])}, end blocks {_frac(check['final_blocks'])} "
        "matched, "
        f"{check['rule_violations']} rule violations; all match: {check['all_match']}.",
        "",
        "## Where the two differ, block by block",
        "",
        "| | recorded | simulated |",
        "|---|---:|---:|",
        f"| trace entries | {rec['entries']:,} | {sim['entries']:,} |",
        f"| allocated at the trace's start | {rec['start_allocated']:,} | {sim['start_allocated']:,} |",
        f"| reserved at the trace's start (before `empty_cache()`) | {rec['start_reserved']:,} | "
        f"{sim['start_reserved']:,} |",
        f"| `segment_free` entries (`empty_cache()`) | {diff['segment_frees']['recorded']} | "
        f"{diff['segment_frees']['simulated']} |",
        f"| peak allocated | {rec['peak_allocated']:,} | {sim['peak_allocated']:,} |",
        f"| allocated at the end | {rec['final_allocated']:,} | {sim['final_allocated']:,} |",
        f"| reserved at the end | {rec['final_reserved']:,} | {sim['final_reserved']:,} |",
        "",
        f"- Blocks live at the trace's start: {_same(diff['start_blocks'])}.",
        f"- Requests live at the end: {_same(diff['end_requests'])}.",
        f"- Block sizes live at the end: {_same(diff['end_block_sizes'])}.",
        f"- Segments at the end: {_same(diff['end_segments'])}.",
        "",
        "Allocations (`alloc` entries) by phase, sizes only one side made (bytes x count):",
        "",
        "| phase | recorded | simulated | only recorded | only simulated |",
        "|---|---:|---:|---|---|",
    ]
    for name in ("forward", "backward", "optimizer"):
        d = diff[f"allocs_{name}"]
        out.append(
            f"| {name} | {d['recorded']:,} | {d['simulated']:,} | {_sizes(d['only_recorded'])} | "
            f"{_sizes(d['only_simulated'])} |"
        )
    return "\n".join(out + ["", "## Why", ""] + _why(r)) + "\n"


#: The fixture's tensor sizes (float32 bytes) by shape: batch 4, context 128, d_model 2560,
#: 32 heads, d_ff 10240, vocabulary 10,000, 32 layers.
SHAPES = {
    4 * 128 * 2560 * 4: "(batch, seq, d_model)",
    2 * 4 * 128 * 2560 * 4: "2 x (batch, seq, d_model)",
    4 * 32 * 128 * 128 * 4: "(batch, heads, seq, seq)",
    4 * 128 * 10240 * 4: "(batch, seq, d_ff)",
    4 * 128 * 10000 * 4: "(batch, seq, vocab): logits",
    10000 * 2560 * 4: "(vocab, d_model): an embedding or LM-head weight",
    2560 * 2560 * 4: "(d_model, d_model): an attention weight",
    10240 * 2560 * 4: "(d_ff, d_model): a feed-forward weight",
}
LAYERS = 32


def _releases(diff: dict) -> str:
    """Whether the simulated trace records ``empty_cache()``'s releases as the GPU's does."""
    frees = diff["segment_frees"]
    if frees["simulated"] == frees["recorded"]:
        return (
            f"Both traces record that `empty_cache()` as {frees['recorded']} `segment_free` entries "
            "(one per released segment), so both replays start from the same reserved bytes."
        )
    return (
        f"The simulated trace records {frees['simulated']} `segment_free` entries for that "
        f"`empty_cache()`, the recording {frees['recorded']} (one per released segment), so the "
        "replays start from different reserved bytes: an omission in the simulated GPU's history, "
        "not in its allocator."
    )


def _why(r: dict) -> list[str]:
    """What the block-by-block figures say about each gap."""
    rec, sim, diff = r["recorded_trace"], r["simulated_trace"], r["differences"]
    ends = diff["end_block_sizes"]
    tails = _total(ends["only_recorded"]) - _total(ends["only_simulated"])
    gap = rec["final_allocated"] - sim["final_allocated"]
    before, start = r["reserved_before_empty_cache"], rec["start_reserved"]
    same = "equal" if before == start else "different"
    backward, forward = diff["allocs_backward"], diff["allocs_forward"]
    return [
        f"- The cache the step started in: the simulated allocator held {before:,} B reserved just before "
        f"the step's `empty_cache()` (the run's timeline), the recording {start:,} B ({same}); the "
        f"allocated bytes and every block live at the trace's start are identical. {_releases(diff)}",
        "- Peak allocated: the step ends with the same requests live on both sides; the allocated gap at "
        f"the end ({gap:,} B) is the block-size difference of those requests ({tails:,} B): a block handed "
        "out whole with an unsplit tail (a remainder of at most 1 MiB is not split off) on one side, cut "
        "exactly from a larger free block on the other. Which free blocks exist when the optimizer's "
        "state is made depends on what the backward pass allocated and freed before, and that differs:",
        f"- Backward: the simulation makes {backward['simulated'] - backward['recorded']:+,} allocations "
        f"against the GPU's. Only the simulation: {_shapes(backward['only_simulated'])}. Only the GPU: "
        f"{_shapes(backward['only_recorded'])}. The GPU's extra blocks are its kernels' scratch "
        "(10 MiB + 16 B per layer, sort buffers; not modelled) and, by the recording's C++ frames, one "
        "(batch, seq, d_model) block inside IndexBackward0 (the embedding's accumulating index_put, "
        "by all appearances a copy of its values); counted by autograd node (the recording's frames "
        "against the simulated run's current node) every other (batch, seq, d_model) block of the "
        "backward pass matches. Gradient sums and max/index backward run in place as on CUDA "
        "(`gpu_mem_track/gpumodel/accumulate.py`); without it the simulation makes hundreds of blocks "
        "the GPU does not (autograd's out-of-place branches under a Python dispatch mode).",
        f"- Forward: only the GPU makes {_shapes(forward['only_recorded'])} (the two large ones at the "
        "loss's `torch.max` and `sum` over the logits, freed at once: far larger than those ops' outputs, "
        "so by all appearances scratch of CUDA's reduction kernels); only the simulation makes "
        f"{_shapes(forward['only_simulated'])}. They leave a segment in the GPU's cache that the "
        "simulation does not have.",
    ]


def _shapes(counts: dict) -> str:
    """``size x count`` with the fixture's shape and the count per layer where they tell."""
    out = []
    for size, n in counts.items():
        shape = SHAPES.get(int(size))
        per_layer = f", {n // LAYERS} per layer" if shape and n >= LAYERS and n % LAYERS == 0 else ""
        out.append(f"{int(size):,} B x{n}" + (f" ({shape}{per_layer})" if shape else ""))
    return "; ".join(out) or "nothing"


def _total(counts: dict) -> int:
    return sum(int(size) * n for size, n in counts.items())


def _row(name: str, pair: dict) -> str:
    return (
        f"| {name} | {pair['simulated']:,} B ({format_bytes(pair['simulated'])}) | {pair['recorded']:,} B "
        f"({format_bytes(pair['recorded'])}) | {pair['error']:+.3%} | {pair['target']:.1%} "
        f"{'met' if pair['met'] else 'MISSED'} |"
    )


def _frac(counts: dict | None) -> str:
    return "-" if not counts else f"{counts['matched']}/{counts['recorded']}"


def _same(both: dict) -> str:
    if not both["only_recorded"] and not both["only_simulated"]:
        return "identical"
    return f"only recorded {_sizes(both['only_recorded'])}; only simulated {_sizes(both['only_simulated'])}"


def _sizes(counts: dict) -> str:
    return ", ".join(f"{int(size):,} x{n}" for size, n in counts.items()) or "-"


def _short(path: str) -> str:
    return path.replace(str(ROOT) + os.sep, "")


if __name__ == "__main__":
    sys.exit(main())
