"""A/B benchmark: ``track()`` of this checkout against the tracker of an older commit.

Both trackers run in one process on one heap (built as ``bench_census.py`` builds it),
their calls alternating, so machine load hits both alike. The older package is taken
from git (``git archive <rev> gpu_mem_track``) into a temporary folder under another
name. Timed: steady-state calls (whichever path the tracker takes; normally the young
scan) and calls right after an untimed ``gc.collect(1)`` (the full heap walk).

    python3 scripts/bench/bench_census_ab.py --old de86b28 [--sizes 1000000,3000000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--old", required=True, help="git revision of the tracker to compare with")
    parser.add_argument("--sizes", default="1000000,3000000", help="live-object targets (%(default)s)")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls of each, per mode (%(default)s)")
    return parser.parse_args(argv)


def load_old(rev: str, folder: Path) -> Any:
    """The ``MemTracker`` class of ``rev``, imported as package ``gmt_old``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "gpu_mem_track"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "gpu_mem_track").rename(folder / "gmt_old")
    sys.path.insert(0, str(folder))
    return importlib.import_module("gmt_old.tracker.memtracker").MemTracker


def time_pair(trackers: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {f"{name} {mode}": [] for name in trackers for mode in ("steady", "walk")}
    for rep in range(repeats):
        order = list(trackers) if rep % 2 else list(reversed(trackers))
        for name in order:
            start = time.perf_counter()
            trackers[name].track()
            times[f"{name} steady"].append(time.perf_counter() - start)
        for name in order:
            gc.collect(1)
            start = time.perf_counter()
            trackers[name].track()
            times[f"{name} walk"].append(time.perf_counter() - start)
        for tracker in trackers.values():
            tracker.track()  # untimed: both know the collections above before the next steady call
    return times


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import bench_census

    from gpu_mem_track.tracker.memtracker import MemTracker

    with tempfile.TemporaryDirectory() as folder:
        classes = {"old": load_old(args.old, Path(folder)), "new": MemTracker}
        held = bench_census.build_tensors(3000)
        for size in (int(s) for s in args.sizes.split(",")):
            heap = bench_census.build_heap(size)
            gc.collect()
            trackers = {}
            for name, cls in classes.items():
                trackers[name] = cls(out_dir=None, verbosity=0, probe=False, device="cpu")
                trackers[name].watch(held["model"], held["optimizer"])
                trackers[name].track()
            times = time_pair(trackers, args.repeats)
            print(f"{len(gc.get_objects()):,} live objects, {args.repeats} calls each, alternating:")
            for key, values in times.items():
                low, mid = min(values) * 1e3, statistics.median(values) * 1e3
                print(f"  {key:10} min {low:7.1f} ms  median {mid:7.1f} ms")
            del heap, trackers
            gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
