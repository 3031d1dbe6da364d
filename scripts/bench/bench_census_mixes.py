"""Benchmark: one census of 100,000 tensors of one kind, native reader against Python reader.

The tensor curve (``bench_census.py --tensor-counts``) holds a training program's mix. This
script times one census (``take_census`` over the given objects, min of ``--repeats``) for
mixes a program may hold in bulk, with each reader, and checks both count the same:

- views of one base: ``data.split(4)``, the base named by the caller;
- leaf tensors requiring grad, before and after a backward (the native reader reads a
  simple gradient with its leaf; the Python reader reads ``.grad`` in the general path);
- frozen parameters;
- tensors of 5,000 different shapes;
- the rows of a named matrix (``unbind``).

    python scripts/bench/bench_census_mixes.py [--count 100000] [--repeats 3] \
        [--out reports/bench_census_mixes.md]

Exits 1 when the readers disagree on a mix, 2 when the native reader cannot be built.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from bench_census import environment, markdown_table, native_status

from gpu_mem_track import native
from gpu_mem_track.tracker.bulk import CensusMemo
from gpu_mem_track.tracker.census import take_census

HEADERS = ("mix", "objects", "storages", "views", "get_objects ms", "native ms", "Python ms", "native ratio",
           "Python ratio", "same census")  # fmt: skip


def mixes(count: int) -> Iterator[tuple[str, list[Any]]]:
    """``(name, objects)``; the first object is the one the caller names."""
    base = torch.zeros(count * 4)
    yield "views of one base (named)", [base, *base.split(4)]
    del base
    leaves = [torch.zeros(4, requires_grad=True) for _ in range(count)]
    yield "leaves requiring grad, no gradient yet", leaves
    torch.stack(leaves).sum().backward()  # a gradient each, in C++ only until read
    yield "leaves requiring grad, with gradients", leaves
    del leaves
    yield "frozen parameters", [torch.nn.Parameter(torch.zeros(4), requires_grad=False) for _ in range(count)]
    yield "5,000 shapes", [torch.zeros(i % 5000 + 1) for i in range(count)]
    rows = torch.zeros(count, 4)
    yield "rows of a named matrix", [rows, *rows.unbind(0)]


def time_census(objects: list[Any], repeats: int) -> tuple[float, Any]:
    """The min time of ``repeats`` censuses with one memo (as a tracker keeps; the Python
    reader reuses what it learnt of unchanged tensors, the native one needs none), each
    object given once (as the tracker's finder gives them)."""
    best, census, memo = float("inf"), None, CensusMemo()
    for _ in range(repeats):
        start = time.perf_counter()
        census = take_census("cpu", objects.copy, [("named", objects[0])], memo=memo, unique=True)
        best = min(best, time.perf_counter() - start)
    return best, census


def bare_scan(repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        gc.get_objects()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100_000, help="tensors per mix (default: %(default)s)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed censuses per reader (default: %(default)s)"
    )
    parser.add_argument(
        "--out", default="reports/bench_census_mixes.md", help="markdown report (%(default)s)"
    )
    args = parser.parse_args(argv)
    reader = native.build_now(quiet=False)
    if reader is None:
        print(f"no native reader: {native.status()}", file=sys.stderr)
        return 2
    env = environment()
    rows, agree = [], True
    for name, objects in mixes(args.count):
        print(f"{name} ...", flush=True)
        with native.use(reader):
            fast, by_native = time_census(objects, args.repeats)
        with native.use(None):
            slow, by_python = time_census(objects, args.repeats)
        scan = bare_scan(args.repeats)
        same = by_native == by_python
        agree = agree and same
        cells = [name, f"{len(objects):,}", f"{by_native.storages:,}", f"{by_native.views:,}"]
        cells += [f"{scan * 1e3:.1f}", f"{fast * 1e3:.1f}", f"{slow * 1e3:.1f}", f"{fast / scan:.2f}"]
        cells += [f"{slow / scan:.2f}", "yes" if same else "NO"]
        rows.append(cells)
        del objects, by_native, by_python
    lines = [
        "# Census benchmark: mixes of 100,000 tensors, native and Python reader",
        "",
        *(
            f"- {key}: {env[key]}"
            for key in ("date_utc", "machine", "cpu_count", "python", "torch", "commit")
        ),
        f"- native: {native_status()}",
        f"- Command: `{env['command']}`",
        "",
        "One `take_census` over the objects given (no heap walk; min of the repeats, one memo kept "
        "across them as a tracker does), the first object named by the caller; ratios against a "
        "bare `gc.get_objects()` of this process. A leaf's gradient, which may exist only in C++, "
        "is read with the leaf by the native reader when dense and alone on its storage (as here), "
        "else in Python by the general path.",
        "",
        *markdown_table(HEADERS, rows),
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(markdown_table(HEADERS, rows)))
    print(f"wrote {out}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
