"""Fuzzing the readers: a few hundred mutations of small, valid inputs (built here; the
recorded snapshots in ../shared/fixtures/snapshots are mutated too when present, never
copied), each given to the commands that read it, in this process through ``cli.main``.

Every outcome must be in the documented set: exit 0 (read, perhaps with notes), or exit
2 with one line on stderr and nothing written; never a traceback (exit 1). Fixed seed:
a failure names its case, and the same case comes back on the next run."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import pickle
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import snapshotfiles as sf
from runfiles import MIB, line, runner_folder, tracker_csv

from gpu_mem_track.cli import main

SEED = 16
#: Cells that readers must refuse or read, never crash on.
NASTY = [
    b"nan", b"inf", b"-inf", b"1_0", "\u0661\u0662".encode(), b"9" * 5000, b"-1", b"1e999", b"1e300",
    b'"', b'""', b",", b"\n", b"\r", b"\x00", b"\xff\xfe", b"\xef\xbb\xbf", b"True", b"", b"0x10",
]  # fmt: skip


def call(*args: object) -> tuple[int, str]:
    """``python -m gpu_mem_track *args`` in this process: (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return code, err.getvalue()


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random change of ``data``: a byte flipped, a span cut, doubled or replaced by a
    nasty cell, the end cut off, or a digit run made huge or strange."""
    if not data:
        return rng.choice(NASTY)
    at = rng.randrange(len(data))
    span = rng.randint(1, 16)
    kind = rng.randrange(7)
    if kind == 0:
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    if kind == 1:
        return data[:at] + data[at + span :]
    if kind == 2:
        return data[:at] + data[at : at + span] * rng.randint(2, 5) + data[at:]
    if kind == 3:
        return data[:at] + rng.choice(NASTY) + data[at + rng.randint(0, 3) :]
    if kind == 4:
        return data[:at]
    digits = [i for i, b in enumerate(data) if 48 <= b <= 57]
    if not digits:
        return data + rng.choice(NASTY)
    at = rng.choice(digits)
    return data[:at] + rng.choice(NASTY[:9]) + data[at + 1 :]


def check(outcome: tuple[int, str], case: str, written: Callable[[], bool]) -> None:
    code, err = outcome
    assert "Traceback" not in err, f"{case}: {err}"
    assert code in (0, 2), f"{case}: exit {code}: {err}"
    if code == 2:
        assert err.count("\n") == 1, f"{case}: {err}"
        assert not written(), f"{case}: exit 2 but something was written"


def snapshot_bytes() -> list[bytes]:
    segment = sf.segment(sf.BASE, [(512, 4, "active_allocated"), (2 * MIB - 512, 0, "inactive")], "small")
    trace = [sf.entry("segment_alloc", sf.BASE, 2 * MIB, 5), sf.entry("alloc", sf.BASE, 512, 6)]
    small = pickle.dumps(sf.snapshot([segment], trace), protocol=2)
    found = []
    if sf.FIXTURES is not None and (sf.FIXTURES / "segments-only.pickle.gz").is_file():
        found.append(gzip.decompress((sf.FIXTURES / "segments-only.pickle.gz").read_bytes()))
    return [small, *found]


def test_snapshot_mutations(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    sources = snapshot_bytes()
    for n in range(100):
        data = mutate(sources[0] if n % 8 else sources[-1], rng)
        if n % 5 == 0:
            data = gzip.compress(data)
        path = tmp_path / f"s{n}.pickle"
        path.write_bytes(data)
        out = tmp_path / f"out{n}"
        check(call("snapshot", path, "--out-dir", out), f"snapshot case {n}", out.exists)


def run_folder(root: Path) -> Path:
    rows = [
        {"elapsed": 0.0, "event": "start", "memory": 0},
        {"elapsed": 0.1, "event": "line", "file": "/src/t.py", "function": "f", "line": 3, "memory": MIB,
         "increment": MIB, "peak": 2 * MIB},
        {"elapsed": 0.2, "event": "track", "label": "a, \"b\"", "memory": MIB},
        {"elapsed": 0.3, "event": "end", "memory": MIB},
    ]  # fmt: skip
    return runner_folder(root, "r", [line("y = f(x, 'a')", 3, 1, 2)], timeline=rows)


@pytest.mark.parametrize("name", ["meta.json", "lines.csv", "timeline.csv"])
def test_run_folder_mutations(tmp_path: Path, name: str) -> None:
    rng = random.Random(f"{SEED}-{name}")
    folder = run_folder(tmp_path / "base")
    original = (folder / name).read_bytes()
    for n in range(40):
        (folder / name).write_bytes(mutate(original, rng))
        page = tmp_path / f"p{n}.html"
        case = f"{name} case {n}"
        check(call("show", folder), f"show {case}", lambda: False)
        check(call("compare", folder, folder), f"compare {case}", lambda: False)
        check(call("html", folder, "-o", page), f"html {case}", page.exists)
        if n == 0:  # matplotlib is slow: one each
            png = tmp_path / f"p{n}.png"
            check(call("plot", folder, "-o", png), f"plot {case}", png.exists)


def test_meta_json_value_mutations(tmp_path: Path) -> None:
    """Each field of meta.json given a value of every wrong kind."""
    folder = run_folder(tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    wrong = ["x", -1, 1.5, None, ["a", 1], 10**30]
    for key in meta:
        for value in wrong:
            (folder / "meta.json").write_text(json.dumps({**meta, key: value}))
            check(call("show", folder), f"meta.json {key}={value!r}", lambda: False)


def test_tracker_csv_mutations(tmp_path: Path) -> None:
    rng = random.Random(f"{SEED}-tracker")
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB), ('b,"c"', 1.0, 2 * MIB), ("d", 2.0, MIB)])
    original = path.read_bytes()
    for n in range(50):
        path.write_bytes(mutate(original, rng))
        page = tmp_path / f"t{n}.html"
        check(call("show", path), f"show tracker case {n}", lambda: False)
        check(call("html", path, "-o", page), f"html tracker case {n}", page.exists)
