"""Validate the snapshot analysis on real recorded snapshots and record what it finds.

Runs ``gpu-mem-track snapshot``'s analysis on every ``*.pickle*`` file of the fixtures
folder (``--fixtures``; default: ``$GPU_MEM_TRACK_SNAPSHOTS``, else ``shared/fixtures/
snapshots`` beside the checkout or one level further up; see ``fixtures.py``), and
writes ``--out`` (default reports/snapshot_check.md) and its .json: the peak, its line,
reserved bytes, the cache at the peak, the top lines, the row of memory from before
recording, the phases, and the cross-check of the replay against the recorded segments
(final allocated and reserved must be equal, to the byte). It also checks the trace
format on each file: that an ``alloc``'s ``size`` is the request (the block's
``requested_size``), not the block, and that frees carry the same request. Exit code 1
when a check fails.

    python scripts/check/check_snapshots.py [--fixtures DIR] [--out reports/snapshot_check.md]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the package, and scripts/_common

from _common.fixtures import described, fixtures_folder, shown  # noqa: E402

from gpu_mem_track.allocator.replay import Replay, replay  # noqa: E402
from gpu_mem_track.snapshotfile import load_snapshot  # noqa: E402
from gpu_mem_track.snapshotfile.records import Snapshot  # noqa: E402
from gpu_mem_track.snapshots.analyse import SnapshotAnalysis, analyse, peak_bound, pick_device  # noqa: E402
from gpu_mem_track.snapshots.attribution import Attributor  # noqa: E402
from gpu_mem_track.units import format_bytes  # noqa: E402


def trace_format(snapshot: Snapshot, device: int) -> dict[str, int]:
    """How the trace's sizes relate to the recorded blocks: for blocks allocated in the
    trace and still in use at the end, whether the alloc's ``size`` equals the block's
    ``requested_size`` and its ``size``; whether each ``free_requested`` carries the
    size of the ``alloc`` before it at that address."""
    trace = snapshot.device_traces[device] if device < len(snapshot.device_traces) else ()
    last: dict[int, int] = {}
    frees_same = frees_other = 0
    for entry in trace:
        if entry.action == "alloc":
            last[entry.addr] = entry.size
        elif entry.action == "free_requested" and entry.addr in last:
            same = last.pop(entry.addr) == entry.size
            frees_same += same
            frees_other += not same
    live = [b for s in snapshot.device_segments(device) for b in s.blocks if b.state == "active_allocated"]
    checked = [(last[b.address], b) for b in live if b.address in last]
    return {
        "live_blocks_from_trace": len(checked),
        "alloc_size_is_requested_size": sum(size == b.requested_size for size, b in checked),
        "alloc_size_is_block_size": sum(size == b.size for size, b in checked),
        "blocks_over_512_rounding": sum(b.size > -(-size // 512) * 512 for size, b in checked),
        "frees_with_alloc_size": frees_same,
        "frees_with_other_size": frees_other,
    }


def check_file(path: Path) -> dict:
    started = time.perf_counter()
    snapshot = load_snapshot(path)
    loaded = time.perf_counter()
    device = pick_device(snapshot)
    replayed = replay(snapshot, device)
    analysis = analyse(snapshot, replayed, Attributor())
    analysed = time.perf_counter()
    check = replayed.check
    passed = (
        check.final_allocated_replayed == check.final_allocated_recorded
        and check.final_reserved_replayed == check.final_reserved_recorded
        and check.segments_matching == check.segments
        and check.blocks_matching == check.blocks_checked
        and not check.misfits
    )
    fmt = trace_format(snapshot, device)
    passed = passed and fmt["alloc_size_is_requested_size"] == fmt["live_blocks_from_trace"]
    passed = passed and not fmt["frees_with_other_size"]
    cuts = ring_buffer_cuts(snapshot, device, replayed) if snapshot.device_traces[device:] else []
    passed = passed and all(cut["within_bound"] and cut["peak_within_bound"] for cut in cuts)
    return {
        "file": path.name,
        "passed": passed,
        "load_seconds": loaded - started,
        "analyse_seconds": analysed - loaded,
        "format": fmt,
        "analysis": analysis,
        "cuts": cuts,
    }


def ring_buffer_cuts(
    snapshot: Snapshot, device: int, full: Replay, count: int = 6, seed: int = 0
) -> list[dict]:
    """The trace cut at seeded random points, as a ring buffer drops its oldest entries:
    the cut trace's replay against the whole trace's (which knows every block) after
    every event. Exact, or low by no more than its stated bound, is a pass."""
    trace = snapshot.device_traces[device]
    if not trace:
        return []
    truth = [full.start_allocated] * len(trace)
    value, steps = full.start_allocated, iter(full.steps)
    step = next(steps, None)
    for index in range(len(trace)):
        while step is not None and step.index == index:
            value, step = step.allocated, next(steps, None)
        truth[index] = value
    rng = random.Random(seed)
    out = []
    for cut in sorted(rng.sample(range(1, len(trace) - 1), count)):
        traces = list(snapshot.device_traces)
        traces[device] = trace[cut:]
        part = replay(replace(snapshot, device_traces=tuple(traces)), device)
        out.append(_compare_cut(cut, part, truth))
    return out


def _compare_cut(cut: int, part: Replay, truth: list[int]) -> dict:
    value, steps = part.start_allocated, iter(part.steps)
    step = next(steps, None)
    exact = within = compared = 0
    for index in range(len(truth) - cut):
        while step is not None and step.index == index:
            value, step = step.allocated, next(steps, None)
        low_by = truth[index + cut] - value
        compared += 1
        exact += low_by == 0
        within += 0 <= low_by <= part.uncertainty(index)
    peak = max([part.start_allocated, *(s.allocated for s in part.steps)])
    true_peak = max(truth[cut - 1 :])
    bound = peak_bound(part)
    return {
        "first_event_kept": cut,
        "events": compared,
        "exact": exact,
        "within_bound": within == compared,
        "unresolved_tails": part.check.unresolved_tails,
        "tail_bytes": part.check.tail_bytes,
        "segments_matching": f"{part.check.segments_matching}/{part.check.segments}",
        "peak": peak,
        "true_peak": true_peak,
        "peak_bound": bound,
        "peak_within_bound": peak <= true_peak <= max(bound, peak),
    }


def _markdown(results: list[dict], folder: Path) -> str:
    out = [
        "# Snapshot analysis on recorded snapshots",
        "",
        f"`python scripts/check/check_snapshots.py` on {described(folder)}. "
        "Memory is the caching allocator's allocated bytes "
        "replayed from the trace, blocks counted as the allocator counts them.",
        "",
    ]
    for result in results:
        out += _file_section(result)
    return "\n".join(out) + "\n"


def _file_section(result: dict) -> list[str]:
    a: SnapshotAnalysis = result["analysis"]
    out = [f"## {result['file']}: {'all checks pass' if result['passed'] else 'CHECK FAILED'}", ""]
    if a.has_trace:
        peak = a.peak
        seconds = (peak.time_us - a.time_start_us) / 1e6 if peak.time_us and a.time_start_us else None
        out += [
            f"- trace: {a.entries:,} entries; segments {a.segments_allocated} allocated, "
            f"{a.segments_freed} freed"
            + "".join(f"; `empty_cache()` released {_b(b)} in {n} segments" for _, b, n in a.empty_cache),
            f"- peak allocated **{_b(peak.allocated)}** ({peak.allocated:,} B) at +{seconds:.3f} s (entry "
            f"{peak.index}), set by a {_b(peak.block)} block for a {_b(peak.request)} request at "
            f"`{_site(peak.site.label)}` [{peak.category}]",
            f"- reserved at the peak {_b(peak.reserved)}; cache (reserved - allocated) "
            f"{_b(a.cache_at_peak)}; "
            f"largest free block {_b(a.largest_free)} of {a.free_blocks}",
            f"- allocated {_b(a.start_allocated)} at the trace's start (the pre-trace row), "
            f"{_b(a.final_allocated)} at its end; reserved {_b(a.start_reserved)} -> {_b(a.final_reserved)} "
            f"(highest {_b(a.max_reserved)})",
        ]
    else:
        out += [
            f"- no trace: {_b(a.final_allocated)} allocated in blocks, {_b(a.final_reserved)} reserved, "
            "cache "
            f"{_b(a.cache_at_peak)}, largest free block {_b(a.largest_free)} of {a.free_blocks}",
        ]
    out += ["", "| phase | live at peak | allocated | allocs |", "|---|---|---|---|"]
    out += [f"| {c.name} | {_b(c.live_at_peak)} | {_b(c.allocated)} | {c.hits} |" for c in a.categories]
    out += [
        "",
        "Top lines by bytes live at the peak:",
        "",
        "| live at peak | allocated | allocs | phase | where |",
    ]
    out.append("|---|---|---|---|---|")
    ranked = sorted(a.lines, key=lambda u: -u.live_at_peak)[:6]
    out += [
        f"| {_b(u.live_at_peak)} | {_b(u.allocated)} | {u.hits} | {u.category} | `{_site(u.site.label)}` |"
        for u in ranked
    ]
    out += ["", _check_text(result), ""]
    if result["cuts"]:
        out += _cuts_table(result["cuts"])
    return out


def _cuts_table(cuts: list[dict]) -> list[str]:
    out = [
        "As a ring buffer would have kept it: the trace cut at seeded random points, replayed from the "
        "cut, against the whole trace's replay after every event (allocated bytes):",
        "",
        "| first event kept | events | exact | within the stated bound | unknown tails (at most) "
        "| peak: replayed / true / bound | segments reproduced |",
        "|---:|---:|---:|---|---|---|---|",
    ]
    for c in cuts:
        out.append(
            f"| {c['first_event_kept']:,} | {c['events']:,} | {c['exact']:,} | "
            f"{'yes' if c['within_bound'] else 'NO'} | {c['unresolved_tails']} ({_b(c['tail_bytes'])}) | "
            f"{_b(c['peak'])} / {_b(c['true_peak'])} / {_b(max(c['peak_bound'], c['peak']))} | "
            f"{c['segments_matching']} |"
        )
    return out + [""]


def _check_text(result: dict) -> str:
    c, f = result["analysis"].check, result["format"]
    return (
        f"Check: final allocated replayed {c.final_allocated_replayed:,} B vs recorded "
        f"{c.final_allocated_recorded:,} B; reserved {c.final_reserved_replayed:,} B vs "
        f"{c.final_reserved_recorded:,} B; blocks in use reproduced in {c.segments_matching}/{c.segments} "
        f"segments; sizes of {c.blocks_matching}/{c.blocks_checked} blocks allocated in the trace and still "
        f"in use; {c.misfits} misfits; {c.unresolved_tails} unresolved tails. Format: of those "
        f"{f['live_blocks_from_trace']} blocks, the alloc's `size` equals `requested_size` for "
        f"{f['alloc_size_is_requested_size']} and the block's `size` for {f['alloc_size_is_block_size']} "
        f"({f['blocks_over_512_rounding']} blocks are larger than the request rounded to 512 B: unsplit "
        f"tails); {f['frees_with_alloc_size']} frees carry their alloc's size, {f['frees_with_other_size']} "
        f"another. Load {result['load_seconds']:.2f} s, analysis {result['analyse_seconds']:.2f} s."
    )


def _b(nbytes: int) -> str:
    return format_bytes(nbytes)


def _site(label: str) -> str:
    """A recorded ``path:line function`` with the path cut to its last two parts."""
    parts = label.split("/")
    return "…/" + "/".join(parts[-2:]) if len(parts) > 3 else label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "snapshot_check.md")
    args = parser.parse_args(argv)
    folder = fixtures_folder(args.fixtures)
    results = [check_file(path) for path in sorted(folder.glob("*.pickle*"))]
    args.out.write_text(_markdown(results, folder), encoding="utf-8")
    data = [{**r, "analysis": r["analysis"].to_dict()} for r in results]
    for item in data:
        item["analysis"]["lines"] = item["analysis"]["lines"][:20]  # the largest; the rest in the folders
        item["analysis"]["source"] = shown(Path(item["analysis"]["source"]))  # no machine's path
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(_markdown(results, folder))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
