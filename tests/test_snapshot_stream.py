"""Snapshots read as a stream: a gzip bomb is refused within its first chunk with memory
bounded, the bounds (bytes on disk, once gunzipped, one value) hold, and every pickle
protocol reads as before."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import snapshotfiles as sf

from gpu_mem_track.errors import BadInput, TooLarge, UsageError
from gpu_mem_track.snapshotfile import load, load_snapshot, loads_snapshot
from gpu_mem_track.snapshotfile import scan as scan_module
from gpu_mem_track.snapshotfile.stream import CHUNK, SnapshotStream

MIB = sf.MIB
ROOT = Path(__file__).resolve().parents[1]


def small_snapshot() -> dict:
    segment = sf.segment(sf.BASE, [(512, 4, "active_allocated"), (2 * MIB - 512, 0, "inactive")], "small")
    return sf.snapshot([segment], [sf.entry("alloc", sf.BASE, 4, 100)])


def bomb(path: Path, members: int, member_bytes: int) -> Path:
    """``members`` gzip members of ``member_bytes`` zeros each, as the issue's bomb (24
    members of 64 MiB) in small."""
    path.write_bytes(gzip.compress(b"\0" * member_bytes, compresslevel=9) * members)
    return path


class Streams:
    """Every ``SnapshotStream`` the loader makes, to read its counts afterwards."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[SnapshotStream] = []
        made = self.made

        class Counted(SnapshotStream):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, **kwargs)
                made.append(self)

        monkeypatch.setattr(load, "SnapshotStream", Counted)


def test_a_gzip_bomb_is_refused_within_its_first_chunk(tmp_path, monkeypatch) -> None:
    path = bomb(tmp_path / "bomb.pickle.gz", 8, 8 * MIB)  # 64 MiB unpacked
    streams = Streams(monkeypatch)
    with pytest.raises(BadInput, match=r"bomb\.pickle\.gz: not a pickle \(invalid load key, '\\x00'"):
        load_snapshot(path)
    (stream,) = streams.made
    assert stream.gzipped  # the unpickler peeks 128 KiB ahead: of 64 MiB, that is all
    assert stream.produced <= 2 * CHUNK and stream.consumed <= 2 * CHUNK


def test_a_non_pickle_plain_file_is_refused_within_its_first_chunk(tmp_path, monkeypatch) -> None:
    path = tmp_path / "zeros.pickle"
    path.write_bytes(b"\0" * (8 * MIB))
    streams = Streams(monkeypatch)
    with pytest.raises(BadInput, match="not a pickle"):
        load_snapshot(path)
    assert streams.made[0].consumed <= 2 * CHUNK and not streams.made[0].gzipped


#: Loads each file named after the memory budget (bytes, "none", or "default": the
#: loader's own) and prints what came of each and the peak resident set (KiB). VmHWM is
#: this process's own peak: ``ru_maxrss`` would keep the parent's across exec.
PEAK = """
import json, sys
from gpu_mem_track.errors import BadInput
from gpu_mem_track.snapshotfile import load_snapshot
budget = {"default": {}, "none": {"memory_budget": None}}.get(sys.argv[1])
budget = {"memory_budget": int(sys.argv[1])} if budget is None else budget
outcome = []
for path in sys.argv[2:]:
    try:
        outcome.append(len(load_snapshot(path, **budget).segments))
    except BadInput as exc:
        outcome.append(str(exc))
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps([outcome, peak]))
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc (Linux)")
def test_peak_memory_stays_bounded_for_a_bomb_and_for_zeros_after_a_pickle(tmp_path) -> None:
    """In a fresh interpreter: a bomb unpacking to 384 MiB, and a snapshot followed by
    256 MiB of zeros (read through after the pickle), each keep the peak resident set far
    under what they unpack to."""
    big = bomb(tmp_path / "bomb.pickle.gz", 24, 16 * MIB)
    trailing = tmp_path / "trailing.pickle.gz"
    zeros = gzip.compress(b"\0" * (64 * MIB), compresslevel=9)
    trailing.write_bytes(gzip.compress(pickle.dumps(small_snapshot())) + zeros * 4)
    done = subprocess.run(
        [sys.executable, "-c", PEAK, "default", str(big), str(trailing)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (refused, segments), peak_kib = json.loads(done.stdout)
    assert "not a pickle" in refused and segments == 1
    assert peak_kib < 96 * 1024, f"peak {peak_kib} KiB"


def test_bytes_past_the_gunzip_bound_are_refused_after_the_pickle_too(tmp_path) -> None:
    path = tmp_path / "long.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(small_snapshot()) + b"\0" * (2 * MIB)))
    with pytest.raises(TooLarge, match=r"expands past 1,048,576 bytes when gunzipped"):
        load_snapshot(path, MIB)
    assert len(load_snapshot(path, 4 * MIB).segments) == 1


def test_a_file_over_the_bound_on_disk_is_refused_before_it_is_read(tmp_path, monkeypatch) -> None:
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(small_snapshot()) + b"\0" * 4096)
    streams = Streams(monkeypatch)
    with pytest.raises(TooLarge, match=r"larger than 1,024 bytes, the most read as a memory snapshot"):
        load_snapshot(path, 1024)
    assert streams.made == []


def test_a_single_value_over_max_value_is_refused(tmp_path, monkeypatch) -> None:
    data = small_snapshot()
    data["segments"][0]["frames"] = [{"filename": "x" * 5000, "line": 1, "name": "f"}]
    path = tmp_path / "long-name.pickle"
    path.write_bytes(pickle.dumps(data))
    assert load_snapshot(path).segments[0].frames[0].filename == "x" * 5000
    monkeypatch.setattr(load, "MAX_VALUE", 4096)
    # The pickle's frame holding the name is what is read at once: 5,000 bytes and more.
    with pytest.raises(
        BadInput, match=r"long-name\.pickle: not a memory snapshot: .* value of [56],\d+ bytes"
    ):
        load_snapshot(path)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_pickle_protocol_reads_as_before(protocol: int) -> None:
    """Protocols 0 and 1 read lines (``readline``), 4 and 5 frames; gzipped or not, each
    gives the snapshot the default protocol gives."""
    data = small_snapshot()
    expected = loads_snapshot(pickle.dumps(data), "s")
    raw = pickle.dumps(data, protocol=protocol)
    assert loads_snapshot(raw, "s") == expected
    assert loads_snapshot(gzip.compress(raw), "s") == expected


def test_a_line_over_max_value_is_refused(monkeypatch) -> None:
    raw = pickle.dumps({"segments": [], "name": "y" * 3000}, protocol=0)
    monkeypatch.setattr(load, "MAX_VALUE", 1024)
    with pytest.raises(BadInput, match=r"a single value of 3,0\d\d bytes at once"):
        loads_snapshot(raw, "s")


def stream_of(data: bytes, limit: int = 10 * MIB, read_limit: int | None = None) -> SnapshotStream:
    return SnapshotStream(io.BytesIO(data), "s", limit=limit, read_limit=read_limit, max_read=MIB)


def test_the_stream_reads_members_with_padding_across_chunks() -> None:
    first = bytes(range(256)) * 1000  # 256,000 bytes: several chunks
    data = gzip.compress(first) + b"\0" * 7 + gzip.compress(b"tail\nend") + b"\0" * 3
    stream = stream_of(data)
    assert stream.peek(3)[:3] == first[:3]
    assert stream.read(10) == first[:10]  # peek did not move on
    assert stream.read(CHUNK + 5) == first[10 : CHUNK + 15]
    assert stream.read(len(first) - CHUNK - 15) == first[CHUNK + 15 :]
    assert stream.readline() == b"tail\n" and stream.readline() == b"end" and stream.read(5) == b""
    assert stream.produced == len(first) + 8 and stream.consumed == len(data)


def test_the_stream_refuses_cut_or_corrupt_gzip_and_its_bounds() -> None:
    whole = gzip.compress(b"x" * 1000)
    with pytest.raises(BadInput, match=r"truncated or corrupt gzip data \(it ends mid-stream\)"):
        stream_of(whole[:20]).drain()
    with pytest.raises(BadInput, match="truncated or corrupt gzip data"):
        stream_of(whole + b"junk").drain()
    with pytest.raises(TooLarge, match="expands past 999 bytes"):
        stream_of(whole, limit=999).drain()
    stream_of(whole, limit=1000).drain()
    with pytest.raises(TooLarge, match="larger than 10 bytes"):
        stream_of(b"y" * 11, read_limit=10)
    with pytest.raises(BadInput, match=r"value of 1,048,577 bytes at once"):
        stream_of(b"z").read(MIB + 1)


def test_the_cli_refuses_a_bomb_in_one_line(tmp_path) -> None:
    path = bomb(tmp_path / "bomb.pickle.gz", 4, 4 * MIB)
    done = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", "snapshot", str(path), "--out-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gpu_mem_track: {path}: not a pickle (invalid load key, '\\x00'.)"
    ]
    assert not (tmp_path / "out").exists()
    assert issubclass(BadInput, UsageError)


# -- past the memory budget: the shape is scanned, building nothing ------------------------


class Scans:
    """Counts the loader's shape scans."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = load.scan

        def counted(*args, **kwargs) -> None:
            self.count += 1
            real(*args, **kwargs)

        monkeypatch.setattr(load, "scan", counted)


LOOSE = rf"more than {scan_module.MAX_LOOSE:,} values outside its records \(lists of anything but records"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("ints", LOOSE),
        ("segment-ints", LOOSE),
        ("shared-dicts", LOOSE),  # a list of one dict repeated: frames at most, and only 65,536
        ("fresh-dicts", LOOSE),  # {} can be a frame or a history entry: not 65,536 of them
        ("int-dict", LOOSE),
        ("shared-entries", LOOSE),  # a trace entry is its own dict, never a memo reference
        ("long-stack", LOOSE),
        ("deep", rf"more than {scan_module.MAX_OPEN:,} containers open at once"),
        ("marks", rf"more than {scan_module.MAX_OPEN:,} containers open at once"),
    ],
)
def test_bombs_past_the_budget_are_refused_by_their_shape(tmp_path, monkeypatch, kind, message) -> None:
    """Each bomb (1.2 million of its value: 2-8 MB unpacked) trips the guard, and the
    scan refuses it in one line naming the file, long before its end."""
    path = sf.write_bomb(tmp_path / f"{kind}.pickle.gz", kind, 1_200_000)
    scans = Scans(monkeypatch)
    with pytest.raises(
        BadInput, match=rf"^{tmp_path}/{kind}\.pickle\.gz: not a memory snapshot: {message}"
    ) as info:
        load_snapshot(path, **sf.tripped())
    assert "\n" not in str(info.value) and scans.count == 1


def test_more_shapes_than_the_scan_keeps_is_one_line() -> None:
    """Lists nested 70,000 deep under a key no one reads: fewer containers open than the
    scan allows, but each level a shape of its own."""
    junk = b"\x8c\x04junk" + b"]" * 70_000 + b"a" * 69_999
    raw = b"\x80\x04}(\x8c\x08segments]" + junk + b"u."
    with pytest.raises(BadInput, match=r"^s: not a memory snapshot: more than 65,536 different shapes"):
        loads_snapshot(raw, "s", **sf.tripped())


def test_small_bombs_under_the_budget_are_refused_as_before(tmp_path, monkeypatch) -> None:
    """Under the budget nothing is scanned: the loader's own shape check refuses."""
    scans = Scans(monkeypatch)
    with pytest.raises(BadInput, match=r"segments\[0\] is malformed \(TypeError"):
        load_snapshot(sf.write_bomb(tmp_path / "b.pickle.gz", "segment-ints", 5000))
    with pytest.raises(BadInput, match=r"segments\[0\] has no 'address' key"):
        load_snapshot(sf.write_bomb(tmp_path / "d.pickle.gz", "shared-dicts", 5000))
    assert scans.count == 0


def big_snapshot(entries: int) -> dict:
    """A snapshot in torch's shape with ``entries`` trace entries sharing a few stacks
    (torch's pickles share each stack list and each frame dict)."""
    stacks = [sf.frames(line) for line in range(10, 40)]
    trace = []
    for i in range(entries):
        entry = sf.entry("alloc" if i % 2 == 0 else "free_requested", sf.BASE + 512 * i, 512, 1000 + i)
        entry["frames"] = stacks[i % len(stacks)]
        trace.append(entry)
    return {**small_snapshot(), "device_traces": [trace, []]}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_snapshot_past_the_budget_is_scanned_then_loaded_as_without_it(
    tmp_path, monkeypatch, protocol
) -> None:
    path = tmp_path / "big.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(big_snapshot(3000), protocol=protocol)))
    expected = load_snapshot(path, memory_budget=None)
    scans = Scans(monkeypatch)
    assert load_snapshot(path, **sf.tripped()) == expected
    assert scans.count == 1 and len(expected.device_traces[0]) == 3000


@pytest.mark.skipif(sf.FIXTURES is None, reason="needs the recorded snapshots in ../shared/fixtures")
def test_recorded_snapshots_pass_the_scan(monkeypatch) -> None:
    scans = Scans(monkeypatch)
    paths = sorted(sf.FIXTURES.glob("*.pickle.gz")) + sorted(sf.FIXTURES.parent.glob("h200/*.pickle.gz"))
    for path in paths:
        assert load_snapshot(path, **sf.tripped()) == load_snapshot(path, memory_budget=None), path
    assert scans.count == len(paths) >= 3


def test_a_global_or_a_cut_past_the_budget_is_refused_by_the_scan(tmp_path) -> None:
    raw = pickle.dumps(big_snapshot(500))
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(raw[:-2] + b"cos\nsystem\n" + raw[-2:])  # a global where the last value was
    with pytest.raises(
        BadInput, match=r"evil\.pickle: not a memory snapshot: it asks for os\.system; refused"
    ):
        load_snapshot(evil, **sf.tripped())
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(BadInput, match=r"cut\.pickle: truncated pickle \(ran out of data\)"):
        load_snapshot(cut, **sf.tripped())


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc (Linux)")
def test_a_small_budget_bounds_the_peak_of_real_bombs(tmp_path) -> None:
    """In fresh interpreters, with the resident set really read: three bombs of 20 MB
    unpacked, which the unpickler alone grows by 100 MiB and more, are refused under a
    16 MiB budget with the peak far under theirs unguarded."""
    paths = [
        sf.write_bomb(tmp_path / "ints.pickle.gz", "ints", 10_000_000),
        sf.write_bomb(tmp_path / "shared.pickle.gz", "shared-dicts", 10_000_000),
        sf.write_bomb(tmp_path / "fresh.pickle.gz", "fresh-dicts", 2_000_000),
    ]
    peaks = {}
    for budget in ("none", str(16 * MIB)):
        done = subprocess.run(
            [sys.executable, "-c", PEAK, budget, *map(str, paths)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outcome, peaks[budget] = json.loads(done.stdout)
        assert all(isinstance(o, str) and "not a memory snapshot" in o for o in outcome), outcome
    assert peaks["none"] > 2 * peaks[str(16 * MIB)], peaks  # measured: 169 MiB against 60
    assert peaks[str(16 * MIB)] < 96 * 1024, peaks


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="reads ru_maxrss (resource)")
def test_the_cli_refuses_a_400_mb_list_bomb_under_1_gib(tmp_path) -> None:
    """The issue's bomb: a 0.8 MB gzip of a valid pickle of [0] * 200,000,000 (400 MB
    unpacked; the C unpickler alone would take 1.6 GB and more). ``snapshot`` refuses
    it in one line, its peak resident set under 1 GiB."""
    path = sf.write_bomb(tmp_path / "ints.pickle.gz", "ints", 200_000_000)
    # ru_maxrss of RUSAGE_CHILDREN is the largest of every child waited for: a fresh process
    # whose only child is the command, so no earlier test's child counts
    measure = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stderr.write(done.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(done.returncode)\n"
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "gpu_mem_track", "snapshot", str(path), "--out-dir", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", measure, *command], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    peak_kib = int(done.stdout.split()[-1])
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"gpu_mem_track: {path}: not a memory snapshot: more than 1,048,576 values outside its records "
        "(lists of anything but records, unknown keys, settings) within its first 3,145,728 bytes"
    ]
    assert peak_kib < 1024 * 1024, f"peak {peak_kib} KiB"
