"""Benchmark: the cost of ``MemTracker.track()`` against a bare ``gc.get_objects()``.

Acceptance target: a ``track()`` call is dominated by finding the tensors among all live
objects. For heaps of about 100k, 1M and 3M live gc-tracked objects holding a few thousand
tensors, this script times ``gc.get_objects()`` and ``tracker.track()`` alternately in one
process, reports min and median of each and their ratio (target: <= 1.5 at 1M and 3M), and
checks that the fast census is complete (same storages and bytes as the exhaustive one).

Writes a markdown report (``--out``) and the same data as JSON next to it. Exits 1 when
a census is incomplete; the ratio target is reported, not enforced.

    python3 scripts/bench/bench_census.py [--sizes 100000,1000000,3000000] [--tensors 3000]

The tensor-count curve (``--tensor-counts``): no extra heap, but 10^3..10^6 small live
tensors (a model of ``Linear(4, 4)`` layers with gradients and Adam state, plain tensors,
views), the same timings; the target there is ``track()`` <= 2x ``gc.get_objects()`` at
10^5 tensors (``reports/bench_census_tensors.md``):

    python3 scripts/bench/bench_census.py --tensor-counts 1000,10000,100000,1000000 \
        --out reports/bench_census_tensors.md
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_mem_track import MemTracker, native
from gpu_mem_track.tracker.census import LiveTensorFinder, full_scan, take_census

TARGET_RATIO = 1.5
TARGET_MIN_SIZE = 1_000_000
FLOATS_PER_TENSOR = 16


class Node:
    """A plain Python object with a ``__dict__``, as application code has many of."""

    def __init__(self, index: int, payload: list[int]) -> None:
        self.index = index
        self.payload = payload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        default="100000,1000000,3000000",
        help="comma-separated target counts of live gc-tracked objects (default: %(default)s)",
    )
    parser.add_argument("--tensors", type=int, default=3000, help="tensors in total (default: %(default)s)")
    parser.add_argument(
        "--tensor-counts",
        default="",
        help="comma-separated tensor counts: time the census against the number of live tensors "
        "instead of the heap size (no extra heap)",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed calls of each (default: %(default)s)")
    parser.add_argument(
        "--curve-layers",
        type=int,
        default=100,
        help="layers of the tensor curve's model: 10 named tensors each (parameters, gradients, Adam "
        "state); 0 gives the model a third of the tensors (default: %(default)s)",
    )
    parser.add_argument(
        "--reader",
        choices=("both", "native", "python"),
        default="both",
        help="the census's reader for --tensor-counts: the native one (built first when it is "
        "not), the Python one, or both, one after the other (default: %(default)s)",
    )
    parser.add_argument(
        "--out", default="reports/bench_census.md", help="markdown report; JSON goes next to it (%(default)s)"
    )
    args = parser.parse_args(argv)
    args.size_list = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    args.count_list = [int(s.replace("_", "")) for s in args.tensor_counts.split(",") if s.strip()]
    if args.repeats < 1 or args.tensors < 20 or not args.size_list:
        parser.error("need --repeats >= 1, --tensors >= 20 and at least one size")
    return args


def build_heap(target: int) -> list[list[Any]]:
    """Add gc-tracked objects until about ``target`` objects are live in total.

    Four kinds in equal numbers, each one tracked object: a one-item list, a dict
    holding that list, a ``Node`` instance and a tuple holding the list.
    """
    count = max(0, target - len(gc.get_objects())) // 4
    lists = [[i] for i in range(count)]
    dicts = [{"index": i, "payload": item} for i, item in enumerate(lists)]
    nodes = [Node(i, item) for i, item in enumerate(lists)]
    tuples = [(i, item) for i, item in enumerate(lists)]
    return [lists, dicts, nodes, tuples]


def build_tensors(total: int, max_layers: int | None = None) -> dict[str, Any]:
    """About ``total`` small tensors: a model with Adam state after one step, plain ones, views.

    Each ``Linear(4, 4)`` layer gives 2 parameters, and each parameter a gradient and
    Adam's ``exp_avg``, ``exp_avg_sq`` and ``step``: 10 tensors per layer; the model holds
    a third of the tensors, or ``max_layers`` layers at most.
    """
    torch.manual_seed(0)
    layers = max(1, min(total // 3 // 10, max_layers or total))
    width = int(FLOATS_PER_TENSOR**0.5)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    n_views = max(1, total // 50)
    n_plain = max(1, total - 10 * layers - n_views)
    plain = [torch.randn(FLOATS_PER_TENSOR) for _ in range(n_plain)]
    views = [plain[i % n_plain][: FLOATS_PER_TENSOR // 2] for i in range(n_views)]
    return {"model": model, "optimizer": optimizer, "plain": plain, "views": views}


def time_calls(tracker: MemTracker, repeats: int, after_collection: bool) -> dict[str, Any]:
    """Alternate timed ``gc.get_objects()`` and ``tracker.track()`` with gc enabled, as in
    a real program. With ``after_collection`` each ``track()`` follows an (untimed)
    ``gc.collect(1)``, which forces the full heap walk; otherwise calls take whichever
    path the tracker chooses, and the paths taken are counted."""
    scan_times: list[float] = []
    track_times: list[float] = []
    paths: dict[str, int] = {}
    stamp = None
    for _ in range(repeats):
        start = time.perf_counter()
        objects = gc.get_objects()
        scan_times.append(time.perf_counter() - start)
        len(objects)
        del objects
        if after_collection:
            gc.collect(1)
        start = time.perf_counter()
        stamp = tracker.track()
        track_times.append(time.perf_counter() - start)
        paths[tracker.last_scan] = paths.get(tracker.last_scan, 0) + 1
    return {"scan": scan_times, "track": track_times, "paths": paths, "stamp": stamp}


def check_complete(stamp: Any) -> dict[str, Any]:
    """Compare the fast census, the exhaustive one and the tracker's last stamp."""
    fast = take_census("cpu", LiveTensorFinder(), [])
    full = take_census("cpu", full_scan, [])
    tensor_objects = len(full_scan())
    complete = (
        fast.storages == full.storages and fast.nbytes == full.nbytes and stamp.ledger.tensors == full.nbytes
    )
    return {
        "storages_fast": fast.storages,
        "storages_full": full.storages,
        "nbytes_fast": fast.nbytes,
        "nbytes_full": full.nbytes,
        "nbytes_stamp": stamp.ledger.tensors,
        "tensor_objects": tensor_objects,
        "complete": complete,
    }


def bench_size(target: int, tensors: int, repeats: int, max_layers: int | None = None) -> dict[str, Any]:
    """Build one heap, time the calls, check completeness, free the heap."""
    held = build_tensors(tensors, max_layers)
    heap = build_heap(target)
    gc.collect()
    live = len(gc.get_objects())
    tracker = MemTracker(out_dir=None, verbosity=0, probe=False, device="cpu")
    tracker.watch(held["model"], held["optimizer"])
    start = time.perf_counter()
    tracker.track()
    first = time.perf_counter() - start
    steady = time_calls(tracker, repeats, after_collection=False)
    walked = time_calls(tracker, repeats, after_collection=True)
    check = check_complete(walked["stamp"])
    check_steady = check_complete(steady["stamp"])
    del tracker, heap, held
    steady.pop("stamp"), walked.pop("stamp")
    gc.collect()
    return {
        "target": target,
        "live_objects": live,
        "first_track_ms": first * 1e3,
        "steady": summarise(steady),
        "after_collection": summarise(walked),
        **check,
        "complete": check["complete"] and check_steady["complete"],
    }


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    """Min and median of both timings, their ratios, and the paths taken."""
    scan, track = run["scan"], run["track"]
    return {
        "get_objects_ms": {"min": min(scan) * 1e3, "median": statistics.median(scan) * 1e3},
        "track_ms": {"min": min(track) * 1e3, "median": statistics.median(track) * 1e3},
        "ratio_min": min(track) / min(scan),
        "ratio_median": statistics.median(track) / statistics.median(scan),
        "paths": run["paths"],
        "samples_ms": {"get_objects": [t * 1e3 for t in scan], "track": [t * 1e3 for t in track]},
    }


def loop_paths(steps: int = 200) -> dict[str, int]:
    """Which census path ``track()`` takes when called once per step of a real training loop
    (a small MLP with Adam on the CPU)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters())
    tracker = MemTracker(out_dir=None, verbosity=0, probe=False, device="cpu")
    tracker.watch(model, optimizer)
    paths: dict[str, int] = {}
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(torch.randn(64, 256)), torch.randint(0, 10, (64,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tracker.track()
        paths[tracker.last_scan] = paths.get(tracker.last_scan, 0) + 1
    return paths


def collection_cost(repeats: int = 30) -> dict[str, float]:
    """The min time of a ``gc.collect(1)`` of 5,000 young lists and 100 young tensors, with
    a live finder's gc callback and without it, in ms."""
    from gpu_mem_track.tracker import finder as finder_module

    finder = finder_module.LiveTensorFinder()
    finder()
    times: dict[str, float] = {}
    for label in ("with", "without"):
        if label == "without":
            gc.callbacks.remove(finder_module._before_promotion)
        best = float("inf")
        for _ in range(repeats):
            young = [[i] for i in range(5000)] + [torch.zeros(2) for _ in range(100)]
            start = time.perf_counter()
            gc.collect(1)
            best = min(best, time.perf_counter() - start)
            del young
        times[label] = best * 1e3
    gc.callbacks.append(finder_module._before_promotion)
    del finder
    return times


def markdown_table(headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table."""
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def git_commit() -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "uncommitted"
    return result.stdout.strip() or "uncommitted"


def environment() -> dict[str, Any]:
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": git_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def target_verdict(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether every heap of at least 1M targeted objects meets the ratio target, per path."""
    judged = [r for r in results if r["target"] >= TARGET_MIN_SIZE]

    def met(mode: str, stat: str) -> bool:
        return bool(judged) and all(r[mode][stat] <= TARGET_RATIO for r in judged)

    return {
        "ratio_target": TARGET_RATIO,
        "applies_from": TARGET_MIN_SIZE,
        "judged_sizes": [r["target"] for r in judged],
        **{
            f"{mode}_met_by_{stat[6:]}": met(mode, stat)
            for mode in MODES
            for stat in ("ratio_min", "ratio_median")
        },
        "complete": all(r["complete"] for r in results),
    }


MODES = ("steady", "after_collection")
HEADERS = (
    "heap target",
    "live objects",
    "storages",
    "calls",
    "paths taken",
    "get_objects min / median ms",
    "track min / median ms",
    "ratio (min)",
    "ratio (median)",
    "complete",
)


def table_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        for mode in MODES:
            m = r[mode]
            rows.append(
                [
                    f"{r['target']:,}",
                    f"{r['live_objects']:,}",
                    f"{r['storages_full']:,}",
                    "steady state" if mode == "steady" else "after gc.collect(1)",
                    ", ".join(f"{n} {path}" for path, n in sorted(m["paths"].items())),
                    f"{m['get_objects_ms']['min']:.1f} / {m['get_objects_ms']['median']:.1f}",
                    f"{m['track_ms']['min']:.1f} / {m['track_ms']['median']:.1f}",
                    f"{m['ratio_min']:.2f}",
                    f"{m['ratio_median']:.2f}",
                    "yes" if r["complete"] else "no",
                ]
            )
    return rows


def render_markdown(env: dict[str, Any], results: list[dict[str, Any]], verdict: dict[str, Any]) -> str:
    yes = {True: "yes", False: "no"}
    firsts = ", ".join(f"{r['target']:,}: {r['first_track_ms']:.1f} ms" for r in results)
    lines = [
        "# Census benchmark: `MemTracker.track()` vs `gc.get_objects()`",
        "",
        f"- Date: {env['date_utc']}",
        f"- Machine: {env['machine']}, {env['cpu_count']} CPUs",
        f"- Python {env['python']}, torch {env['torch']}",
        f"- Commit: {env['commit']}",
        f"- Command: `{env['command']}`",
        "",
        *markdown_table(HEADERS, table_rows(results)),
        "",
        f"Target: ratio `track()` / `gc.get_objects()` <= {TARGET_RATIO} at heaps of "
        f"{TARGET_MIN_SIZE:,} objects and more, with the census complete.",
        "",
        f"- Steady state: met by min **{yes[verdict['steady_met_by_min']]}**, "
        f"by median **{yes[verdict['steady_met_by_median']]}**",
        f"- After a gen-1 collection: met by min "
        f"**{yes[verdict['after_collection_met_by_min']]}**, "
        f"by median **{yes[verdict['after_collection_met_by_median']]}**",
        f"- Census complete at every size: **{yes[verdict['complete']]}** "
        "(fast vs exhaustive storages and bytes, and the last stamp's `ledger.tensors`)",
        f"- First `track()` call (asks about every tensor subclass): {firsts}",
        "- Paths taken by `track()` once per step of a 200-step MLP training loop with Adam: "
        + ", ".join(f"{n} {path}" for path, n in sorted(verdict["training_loop_paths"].items())),
        "- The finder's gc callback: a `gc.collect(1)` of 5,000 young lists and 100 young tensors "
        f"took {verdict['collection_ms']['with']:.2f} ms with it and "
        f"{verdict['collection_ms']['without']:.2f} ms without (min of 30).",
        "",
        "Live objects is `len(gc.get_objects())` after building, interpreter and torch included, "
        "so a target below that baseline adds nothing. Calls alternate with gc enabled, as in a "
        "real program. The tracker walks the heap (`gc.get_referrers` over the tensor classes) "
        "at its first call and after a collection it did not see; otherwise it scans only the "
        "young generations and the tensors it knew (`paths taken` counts each). *After "
        "gc.collect(1)*: an untimed `gc.collect(1)` before each `track()`; the finder's gc "
        "callback took the young tensors just before it, so these calls scan young objects "
        "too. The full walk's cost is the first call's. "
        f"Census reader: {native_status()}.",
        "",
    ]
    return "\n".join(lines)


def print_table(results: list[dict[str, Any]]) -> None:
    rows = [list(HEADERS), *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    for row in rows:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths)))


#: The curve's model (``--curve-layers``, default 100 layers: 1,000 named tensors with
#: gradients and Adam state); the other tensors are plain, 2% of them views, as a program's
#: data, activations and caches.
TENSORS_TARGET = 2.0
TENSORS_TARGET_COUNT = 100_000


def native_status() -> str:
    """``native.status()`` with the home folder written ``~``."""
    return native.status().replace(str(Path.home()), "~")


def readers(choice: str) -> list[tuple[str, Any]]:
    """``(name, module or None)`` for each reader to time: the native one is built first."""
    chosen = []
    if choice in ("both", "native"):
        module = native.build_now(quiet=False)
        if module is None:
            print(f"no native reader: {native.status()}", file=sys.stderr)
        else:
            chosen.append(("native", module))
    if choice in ("both", "python"):
        chosen.append(("python", None))
    return chosen


def tensor_curve(args: argparse.Namespace, env: dict[str, Any]) -> int:
    """The census's cost against the number of live tensors (``--tensor-counts``)."""
    results = []
    for name, module in readers(args.reader):
        for count in args.count_list:
            print(f"{count:,} tensors, {name} reader ...", flush=True)
            with native.use(module):
                run = bench_size(0, count, args.repeats, args.curve_layers or None)
                results.append({"reader": name, **run})
    env["native"] = native_status()
    headers = ["reader", "tensors", "storages", "live objects", "calls", "paths", "get_objects min ms",
               "track min ms", "ratio (min)", "ratio (median)", "ns per tensor (min)",
               "complete"]  # fmt: skip
    rows = []
    for r in results:
        for mode in MODES:
            m = r[mode]
            rows.append([
                r["reader"], f"{r['tensor_objects']:,}", f"{r['storages_full']:,}", f"{r['live_objects']:,}",
                "steady state" if mode == "steady" else "after gc.collect(1)",
                ", ".join(f"{n} {path}" for path, n in sorted(m["paths"].items())),
                f"{m['get_objects_ms']['min']:.1f}", f"{m['track_ms']['min']:.1f}",
                f"{m['ratio_min']:.2f}", f"{m['ratio_median']:.2f}",
                f"{m['track_ms']['min'] * 1e6 / max(r['tensor_objects'], 1):.0f}",
                "yes" if r["complete"] else "no",
            ])  # fmt: skip
    print("\n".join("  ".join(row) for row in [headers, *rows]))
    judged = {
        name: [
            r
            for r in results
            if r["reader"] == name and 0.9 <= r["tensor_objects"] / TENSORS_TARGET_COUNT <= 1.1
        ]
        for name in dict.fromkeys(r["reader"] for r in results)
    }
    lines = [
        "# Census benchmark: `track()` against the number of live tensors",
        "",
        *(
            f"- {k}: {env[k]}"
            for k in ("date_utc", "machine", "cpu_count", "python", "torch", "commit", "native")
        ),
        f"- Command: `{env['command']}`",
        "",
        *markdown_table(headers, rows),
        "",
        f"Target: `track()` <= {TENSORS_TARGET}x `gc.get_objects()` at {TENSORS_TARGET_COUNT:,} tensors "
        "(by min):",
        *(
            f"- {name} reader: "
            + ", ".join(f"{mode} **{'met' if _met(rows_of, mode) else 'not met'}**" for mode in MODES)
            for name, rows_of in judged.items()
        ),
        "",
        "*ns per tensor*: `track()`'s min time over the tensor count. *after gc.collect(1)*: an "
        "untimed `gc.collect(1)` before each `track()`; the finder's gc callback took the young "
        "tensors just before it, so the census still scans only young objects (`paths`).",
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    for r in results:
        for mode in MODES:
            r[mode].pop("samples_ms", None)
    out.with_suffix(".json").write_text(json.dumps({"environment": env, "results": results}, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0 if all(r["complete"] for r in results) else 1


def _met(judged: list[dict[str, Any]], mode: str) -> bool:
    return bool(judged) and all(r[mode]["ratio_min"] <= TENSORS_TARGET for r in judged)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    if args.count_list:
        return tensor_curve(args, env)
    results = []
    for target in args.size_list:
        print(f"heap of about {target:,} objects ...", flush=True)
        results.append(bench_size(target, args.tensors, args.repeats))
    verdict = target_verdict(results)
    verdict["training_loop_paths"] = loop_paths()
    verdict["collection_ms"] = collection_cost()
    print_table(results)
    print(f"target ratio <= {TARGET_RATIO} at >= {TARGET_MIN_SIZE:,}: {verdict}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_markdown(env, results, verdict))
    payload = {"environment": env, "verdict": verdict, "results": results}
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0 if verdict["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
