"""Check the caching-allocator simulator against recorded PyTorch memory snapshots;
writes a report (default reports/allocator_check.md) and its .json.

    python scripts/check/check_allocator.py [FOLDER] [--out PATH.md]

FOLDER (default: ``$GPU_MEM_TRACK_SNAPSHOTS``, else ../shared/fixtures/snapshots beside the
checkout; see ``fixtures.py``) holds ``*.pickle`` / ``*.pickle.gz`` snapshots. For each
one with a trace: rebuild the cache at the trace's start, replay every call through the
simulator and count the decisions it got right (``gpu_mem_track.allocator.replay``).
For each without: load its segments into the simulator and export them back. For all:
check the recorded end state against the model's rules. Each trace is also replayed
cut at seeded random points, as a smaller ring buffer would have kept it. Then, as a
control, replay the longest trace under settings it was not recorded with, to show the
check can fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the package, and scripts/_common

from _common.fixtures import described, fixtures_folder, shown  # noqa: E402

from gpu_mem_track.allocator import Allocator, parse_alloc_conf, settings_from_snapshot  # noqa: E402
from gpu_mem_track.allocator.replay import replay_snapshot  # noqa: E402
from gpu_mem_track.allocator.rules import rule_violations  # noqa: E402
from gpu_mem_track.allocator.tally import Tally, compare_final  # noqa: E402
from gpu_mem_track.snapshotfile import Snapshot, load_snapshot  # noqa: E402
from gpu_mem_track.units import format_bytes  # noqa: E402

CONTROLS = ("roundup_power2_divisions:4", "max_split_size_mb:40")
#: Ring-buffer cuts replayed per traced snapshot (seeded, so the figures repeat).
CUTS = 8


def round_trip(snapshot: Snapshot) -> dict:
    """Load the end state into the simulator and export it back."""
    settings = settings_from_snapshot(snapshot.allocator_settings)
    segments = snapshot.device_segments(0)
    allocator = Allocator.from_segments(segments, settings)
    seg, blocks = compare_final(segments, allocator.segments())
    return {
        "segments": seg.__dict__,
        "blocks": blocks.__dict__,
        "allocated": allocator.allocated,
        "recorded_allocated": sum(s.allocated_size for s in segments),
        "reserved": allocator.reserved,
        "recorded_reserved": sum(s.total_size for s in segments),
        "largest_free_block": allocator.largest_free_block(),
    }


def replayed(report, path: Path) -> dict:
    """``report.to_dict()`` with the snapshot named as the report names folders (``shown``),
    not as the command line gave it."""
    return {**report.to_dict(), "source": f"{shown(path.parent)}/{path.name}"}


def check(path: Path) -> dict:
    started = time.perf_counter()
    snapshot = load_snapshot(path)
    loaded = time.perf_counter() - started
    settings = settings_from_snapshot(snapshot.allocator_settings)
    checks, problems = rule_violations(snapshot.segments, settings)
    out = {
        "file": path.name,
        "load_seconds": round(loaded, 3),
        "segments": len(snapshot.segments),
        "events": sum(len(t) for t in snapshot.device_traces),
        "settings": settings.conf_string(),
        "rule_checks": checks,
        "rule_violations": problems,
    }
    if out["events"]:
        started = time.perf_counter()
        report = replay_snapshot(snapshot)
        out["replay_seconds"] = round(time.perf_counter() - started, 3)
        out["replay"] = replayed(report, path)
    else:
        out["round_trip"] = round_trip(snapshot)
    return out


def controls(path: Path) -> list[dict]:
    snapshot = load_snapshot(path)
    rows = []
    for conf in CONTROLS:
        report = replay_snapshot(snapshot, settings=parse_alloc_conf(conf))
        rows.append({"file": path.name, "settings": conf, "replay": replayed(report, path)})
    return rows


def cut_replays(path: Path) -> list[dict]:
    """Replay the trace cut at random points, as a shorter ring buffer would have kept it:
    the start state must then be rebuilt with blocks allocated before the cut, whose
    unsplit remainders the rebuild has to settle."""
    snapshot = load_snapshot(path)
    trace = snapshot.device_traces[0]
    rows = []
    for cut in sorted(random.Random(0).sample(range(1, len(trace)), CUTS)):
        report = replay_snapshot(dataclasses.replace(snapshot, device_traces=(trace[cut:],)))
        rows.append({"file": path.name, "cut": cut, "replay": replayed(report, path)})
    return rows


def cut_rows(rows: list[dict]) -> list[str]:
    lines = [
        "| snapshot | first event kept | events | allocs at torch's address | segment allocs "
        "| end blocks | tails: seen / inferred / none | all match |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        p = r["replay"]
        assumed = p["tails"] - p["pinned"] - p["inferred"]
        lines.append(
            f"| {r['file']} | {r['cut']:,} | {p['events']:,} | {tally(p['allocs'])} "
            f"| {tally(p['segment_allocs'])} | {tally(p['final_blocks'])} "
            f"| {p['pinned']} / {p['inferred']} / {assumed} "
            f"| {'yes' if p['all_match'] else 'no'} |"
        )
    return lines


def tally(data: dict) -> str:
    t = Tally(**data)
    return f"{t.matched:,} / {t.recorded:,}" + (
        "" if t.predicted == t.recorded else f" ({t.predicted:,} predicted)"
    )


def replay_rows(results: list[dict]) -> list[str]:
    rows = [
        "| snapshot | events | allocs at torch's address | segment allocs | segment frees "
        "| end segments | end blocks | unsplit tails pinned | mismatches | all match |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        p = r["replay"]
        rows.append(
            f"| {r['file']} ({r.get('settings') or 'defaults'}) | {p['events']:,} | {tally(p['allocs'])} "
            f"| {tally(p['segment_allocs'])} | {tally(p['segment_frees'])} | {tally(p['final_segments'])} "
            f"| {tally(p['final_blocks'])} | {p['pinned']} / {p['tails']} | {p['mismatch_count']:,} "
            f"| {'yes' if p['all_match'] else 'no'} |"
        )
    return rows


def not_covered(traced: list[dict], cuts: list[dict]) -> list[str]:
    """What these traces did not exercise, from their own figures, and known limits."""
    replays = [r["replay"] for r in traced]
    cut = [c["replay"] for c in cuts]
    lines = []
    if not sum(p["ooms"]["recorded"] for p in replays):
        lines.append("- No recorded OOM: the release-and-retry path is covered by unit tests only.")
    if not sum(p["tails"] for p in replays):
        lines.append(
            f"- The full traces start with no block whose remainder is unknown; the cuts above settle "
            f"{sum(p['tails'] for p in cut):,} such blocks ({sum(p['pinned'] for p in cut):,} seen, "
            f"{sum(p['inferred'] for p in cut)} inferred)."
        )
    if not sum(p["inferred"] for p in replays + cut):
        lines.append(
            "- No remainder had to be inferred from a best-fit decision on these traces: that path is "
            "covered by tests/test_allocator_replay.py (a hand-built trace, random workloads cut anywhere)."
        )
    if not any(r["settings"] for r in traced):
        lines.append(
            "- All traces use the default settings: `max_split_size_mb`, `roundup_power2_divisions` and "
            "`expandable_segments` are covered by unit tests (and the controls above) only."
        )
    if sum(p["unsupported_events"] for p in replays):
        lines.append(
            "- Expandable-segment events (`segment_map`/`segment_unmap`) were replayed, but the model's "
            "mapping decisions were not compared."
        )
    lines.append(
        "- In a trace recorded without stacks, a free whose completion follows at once is taken as "
        "immediate (with stacks, a completion forced later by a cache release is told by its stack)."
    )
    return lines


def replay_notes(traced: list[dict]) -> list[str]:
    lines = []
    for r in traced:
        p = r["replay"]
        lines.append(
            f"- {r['file']}: loaded in {r['load_seconds']} s, replayed in {r['replay_seconds']} s; "
            f"{p['start_segments']} segments and {p['start_live_blocks']} live blocks at the trace's start; "
            f"{p['empty_cache_calls']} `empty_cache()` call(s); simulated peaks "
            f"{format_bytes(p['peak_allocated'])} allocated, {format_bytes(p['peak_reserved'])} reserved."
        )
        for m in p["mismatches"]:
            lines.append(
                f"  - event {m['index']}: {m['what']}: recorded {m['recorded']}, predicted {m['predicted']}"
            )
        lines.extend(f"  - rebuild: {problem}" for problem in p["problems"])
    return lines


def round_trip_notes(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        if "round_trip" in r:
            t = r["round_trip"]
            lines.append(
                f"- {r['file']}: {r['segments']:,} segments loaded into the simulator and exported back: "
                f"segments {tally(t['segments'])}, blocks {tally(t['blocks'])}; allocated "
                f"{t['allocated']:,} B (recorded {t['recorded_allocated']:,}), reserved {t['reserved']:,} B "
                f"(recorded {t['recorded_reserved']:,}); "
                f"largest free block {format_bytes(t['largest_free_block'])}."
            )
    return lines


def rule_notes(results: list[dict]) -> list[str]:
    lines = ["| snapshot | checks | violations |", "|---|---:|---:|"]
    lines += [f"| {r['file']} | {r['rule_checks']:,} | {len(r['rule_violations'])} |" for r in results]
    lines += [f"- {r['file']}: {problem}" for r in results for problem in r["rule_violations"][:10]]
    return lines


INTRO = (
    "The simulator (`gpu_mem_track/allocator/`) replays each recorded trace from the cache "
    "rebuilt at the trace's start (end state minus the net of the trace). The device answers "
    "as the recorded GPU did (a `cudaMalloc` refused until the model has released as many "
    "segments as torch did in that call; the recorded address when the segment size agrees), "
    "so every count below is a decision of the model: segment sizes and when they are "
    "allocated, which segments `empty_cache()` releases and in which order, the address of "
    "every block, and the end state block for block (address, size, state, request)."
)
RULES = (
    "Rules checked (`allocator/rules.py`): segment sizes (2 MiB small; 20 MiB or a 2 MiB multiple "
    "of at least 10 MiB large), blocks tiling their segment in 512 B multiples, no two free "
    "neighbours, small-pool blocks of exactly the rounded request, large-pool blocks at most "
    "1 MiB over it, free remainders in split large segments over 1 MiB."
)


def markdown(meta: dict, results: list[dict], cuts: list[dict], control_rows: list[dict]) -> str:
    traced = [r for r in results if "replay" in r]
    lines = [
        "# Allocator check",
        "",
        f"Commit {meta['commit']}, {meta['date']}; written by `{meta['command']}` (read: {meta['read']}).",
        "",
        INTRO,
        "",
        "## Replays of the recorded traces",
        "",
        *replay_rows(traced),
        "",
        *replay_notes(traced),
        "",
        "## The same traces cut short, as a smaller ring buffer would keep them",
        "",
        "Each trace replayed from a random event on (seeded), against the same end state. The "
        "cache at the cut is rebuilt from the end state and the rest of the trace; blocks "
        "allocated before the cut and freed after it have an unknown unsplit remainder (up to "
        "1 MiB), settled by a block start seen where they end (*seen*), by a best-fit decision "
        "of the replay (*inferred*), or taken as none when nothing in the trace depends on it.",
        "",
        *cut_rows(cuts),
        "",
        "## Snapshots without a trace: state round trip",
        "",
        *round_trip_notes(results),
        "",
        "## The recorded end states against the model's rules",
        "",
        *rule_notes(results),
        "",
        RULES,
        "",
        "## Control: the longest trace under settings it was not recorded with",
        "",
        "The same replay with other settings must disagree, or the figures above would prove nothing.",
        "",
        *replay_rows(control_rows),
        "",
        "## Not covered",
        "",
        *not_covered(traced, cuts),
        "- `garbage_collection_threshold` and CUDA-graph private pools are not modelled.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="the snapshot folder (see fixtures.py)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "allocator_check.md")
    args = parser.parse_args(argv)
    folder = fixtures_folder(args.folder)
    paths = sorted(p for p in folder.iterdir() if p.name.endswith((".pickle", ".pickle.gz")))
    results = [check(p) for p in paths]
    longest = max((r for r in results if r["events"]), key=lambda r: r["events"], default=None)
    control_rows = controls(folder / longest["file"]) if longest else []
    cuts = [row for r in results if r["events"] for row in cut_replays(folder / r["file"])]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    meta = {
        "commit": commit.stdout.strip() or "unknown",
        "date": datetime.date.today().isoformat(),
        "command": "python scripts/check/check_allocator.py",
        "folder": shown(folder),
        "read": described(folder),
    }
    args.out.with_suffix(".json").write_text(
        json.dumps({**meta, "snapshots": results, "cuts": cuts, "controls": control_rows}, indent=1) + "\n"
    )
    args.out.write_text(markdown(meta, results, cuts, control_rows))
    traced = [r["replay"]["all_match"] for r in results if "replay" in r] + [
        c["replay"]["all_match"] for c in cuts
    ]
    print(f"{sum(traced)}/{len(traced)} traces replayed, every decision matched: see {args.out}")
    return 0 if all(traced) else 1


if __name__ == "__main__":
    sys.exit(main())
