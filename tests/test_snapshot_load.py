"""The safe snapshot loader: plain and gzip pickles in torch's shape, every global refused,
one-line errors for bad files, and the recorded fixtures when ../shared is present."""

from __future__ import annotations

import gzip
import pathlib
import pickle
from collections import Counter
from pathlib import Path

import pytest
import snapshotfiles as sf

from gpu_mem_track.errors import UsageError
from gpu_mem_track.snapshotfile import Frame, Snapshot, load_snapshot, loads_snapshot, snapshot_from_data

MIB = sf.MIB


def _two_segments() -> dict:
    small = sf.segment(sf.BASE, [(512, 4, "active_allocated"), (2 * MIB - 512, 0, "inactive")], "small")
    large = sf.segment(
        sf.BASE + 64 * MIB, [(4 * MIB, 4_000_000, "active_allocated"), (16 * MIB, 0, "inactive")], "large"
    )
    trace = [
        sf.entry("segment_alloc", sf.BASE + 64 * MIB, 20 * MIB, 100),
        sf.entry("alloc", sf.BASE + 64 * MIB, 4_000_000, 101, line=20),
        sf.entry("oom", 0, 3 * 2**40, 102),
    ]
    trace[-1]["device_free"] = 5 * MIB
    return sf.snapshot([small, large], trace)


def test_loads_torch_shape(tmp_path: Path) -> None:
    snap = load_snapshot(sf.write(tmp_path / "a.pickle", _two_segments()))
    assert snap.source == str(tmp_path / "a.pickle")
    small, large = snap.segments
    assert (small.segment_type, small.total_size, small.allocated_size) == ("small", 2 * MIB, 512)
    assert [(b.address, b.size, b.requested_size, b.state) for b in large.blocks] == [
        (sf.BASE + 64 * MIB, 4 * MIB, 4_000_000, "active_allocated"),
        (sf.BASE + 68 * MIB, 16 * MIB, 0, "inactive"),
    ]
    assert large.blocks[0].frames[-1] == Frame("/src/train.py", 12, "step")
    alloc = snap.device_traces[0][1]
    assert (alloc.action, alloc.addr, alloc.size, alloc.time_us) == (
        "alloc",
        sf.BASE + 64 * MIB,
        4_000_000,
        101,
    )
    assert alloc.frames[-1].line == 20
    oom = snap.device_traces[0][2]
    assert (oom.addr, oom.device_free) == (0, 5 * MIB)
    assert snap.allocator_settings["max_split_size"] == -1
    assert snap.devices() == (0,)


def test_round_trip_through_to_dict(tmp_path: Path) -> None:
    snap = load_snapshot(sf.write(tmp_path / "a.pickle", _two_segments()))
    again = Snapshot.from_dict(snap.to_dict(), snap.source)
    assert again == snap


@pytest.mark.parametrize("name", ["s.pickle.gz", "s.pickle"])
def test_gzip_told_by_magic_bytes(tmp_path: Path, name: str) -> None:
    snap = load_snapshot(sf.write(tmp_path / name, _two_segments(), compress=True))
    assert len(snap.segments) == 2 and len(snap.device_traces[0]) == 3


def test_identical_stacks_are_shared() -> None:
    snap = snapshot_from_data(_two_segments())
    first, second = snap.device_traces[0][0], snap.device_traces[0][2]
    assert first.frames is second.frames


def test_optional_keys_missing_and_extra_keys_tolerated() -> None:
    data = _two_segments()
    del data["allocator_settings"], data["device_traces"]
    seg = data["segments"][1]
    for key in (
        "allocated_size",
        "active_size",
        "requested_size",
        "is_expandable",
        "segment_pool_id",
        "frames",
    ):
        del seg[key]
    seg["something_new"] = {"x": 1}
    del seg["blocks"][1]["address"]  # derived from the running sum of sizes
    snap = snapshot_from_data(data)
    assert snap.device_traces == () and snap.allocator_settings == {}
    large = snap.segments[1]
    assert (large.allocated_size, large.requested_size, large.segment_pool_id) == (4 * MIB, 4_000_000, (0, 0))
    assert large.blocks[1].address == sf.BASE + 68 * MIB


def test_history_frames_of_torch_2_0_blocks() -> None:
    data = _two_segments()
    b = data["segments"][1]["blocks"][0]
    del b["frames"], b["requested_size"]
    b["history"] = [{"addr": b["address"], "real_size": 3_999_000, "frames": sf.frames(44)}]
    block = snapshot_from_data(data).segments[1].blocks[0]
    assert (block.requested_size, block.frames[-1].line) == (3_999_000, 44)


def test_bare_list_of_segments() -> None:
    snap = snapshot_from_data(_two_segments()["segments"])
    assert len(snap.segments) == 2 and snap.device_traces == ()


class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def test_refuses_globals_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    data = _two_segments()
    data["segments"][0]["frames"] = [_Touch(marker)]
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(data))
    with pytest.raises(
        UsageError, match=r"evil\.pickle: not a memory snapshot: it asks for .*touch; refused"
    ):
        load_snapshot(path)
    assert not marker.exists()


def _raw() -> bytes:
    return pickle.dumps(_two_segments())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (_raw()[:200], "truncated pickle"),
        (gzip.compress(_raw(), mtime=0)[:300], "truncated or corrupt gzip"),
        (b"segments: none\n", "not a pickle"),
        (b"PK\x03\x04rest-of-a-zip", "a zip archive"),
        (pickle.dumps([1, 2]), r"segments\[0\] is malformed"),
        (pickle.dumps({"device_traces": []}), "no 'segments' key"),
        (pickle.dumps("hello"), "holds a str, not a dict"),
        (pickle.dumps({"segments": [], "device_traces": 5}), "'device_traces' is a int, not a list"),
    ],
)
def test_bad_files_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=message) as info:
        load_snapshot(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_missing_required_keys_named() -> None:
    data = _two_segments()
    del data["segments"][1]["blocks"][1]["size"]
    with pytest.raises(UsageError, match=r"segments\[1\]\.blocks\[1\] has no 'size' key"):
        snapshot_from_data(data, "x")
    data = _two_segments()
    del data["device_traces"][0][2]["action"]
    with pytest.raises(UsageError, match=r"device_traces\[0\]\[2\] has no 'action' key"):
        snapshot_from_data(data, "x")


def test_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        load_snapshot(tmp_path / "missing.pickle")
    with pytest.raises(UsageError, match="a directory"):
        load_snapshot(tmp_path)
    with pytest.raises(UsageError, match="empty after gunzip"):
        loads_snapshot(gzip.compress(b""), "z")


FIXTURES = sf.FIXTURES
needs_fixtures = pytest.mark.skipif(FIXTURES is None, reason="../shared/fixtures/snapshots not present")


@needs_fixtures
def test_recorded_training_step() -> None:
    snap = load_snapshot(FIXTURES / "transformer-2.7b-ctx128-train-step.pickle.gz")
    actions = Counter(e.action for e in snap.device_traces[0])
    assert (actions["alloc"], actions["segment_alloc"], actions["segment_free"]) == (6770, 782, 430)
    assert len(snap.segments) == 1010
    for seg in snap.segments:
        at = seg.address
        for b in seg.blocks:
            assert b.address == at
            at += b.size
        assert at == seg.end
        assert seg.allocated_size == sum(b.size for b in seg.blocks if b.state == "active_allocated")


@pytest.mark.slow
@needs_fixtures
def test_recorded_segments_only_and_forward() -> None:
    only = load_snapshot(FIXTURES / "segments-only.pickle.gz")
    assert len(only.segments) == 1457 and only.device_traces == ((),)
    assert sum(s.total_size for s in only.segments) > 75 * 10**9
    amp = load_snapshot(FIXTURES / "transformer-2.7b-ctx128-forward-amp.pickle.gz")
    assert len(amp.device_traces[0]) == 5992


# -- the shape scan (files past the memory budget) agrees with the loader ------------------


def _seg(d: dict) -> dict:
    return d["segments"][1]


def _entry(d: dict) -> dict:
    return d["device_traces"][0][1]


#: Changes to a snapshot, each with what both the loader and the scan make of it:
#: None (loads) or a part of the scan's message (both refuse).
VARIANTS = {
    "as recorded": (lambda d: None, None),
    "address a whole float": (lambda d: _seg(d).update(address=float(2**40)), None),
    "blocks a tuple": (lambda d: _seg(d).update(blocks=tuple(_seg(d)["blocks"])), None),
    "stream None, pool a list": (lambda d: _seg(d).update(stream=None, segment_pool_id=[1, -2]), None),
    "unknown key holding a list": (lambda d: _seg(d).update(foo=[1, 2]), None),
    "torch 2.0 history": (
        lambda d: _seg(d)["blocks"][0].update(
            frames=None, history=[{"addr": 1, "real_size": 5, "frames": []}]
        ),
        None,
    ),
    "no traces, settings None": (lambda d: d.update(device_traces=None, allocator_settings=None), None),
    "an empty frame": (lambda d: _entry(d)["frames"].append({}), None),
    "address text": (
        lambda d: _seg(d).update(address="0x10"),
        r"segments\[1\]\.address is a str, not an integer",
    ),
    "address negative": (lambda d: _seg(d).update(address=-1), r"segments\[1\]\.address is a negative int"),
    "no blocks": (lambda d: _seg(d).pop("blocks"), r"segments\[1\] has no 'blocks' key"),
    "device None": (
        lambda d: _seg(d).update(device=None),
        r"segments\[1\]\.device is None, not a device number",
    ),
    "pool of one": (
        lambda d: _seg(d).update(segment_pool_id=(1,)),
        r"segments\[1\]\.segment_pool_id is a tuple, not a pair",
    ),
    "frames of ints": (
        lambda d: _seg(d).update(frames=[1]),
        r"segments\[1\]\.frames\[0\] is an int, not a frame",
    ),
    "block size text": (
        lambda d: _seg(d)["blocks"][0].update(size="1"),
        r"segments\[1\]\.blocks\[0\]\.size is a str",
    ),
    "history of ints": (
        lambda d: _seg(d)["blocks"][0].update(frames=None, history=[5]),
        r"segments\[1\]\.blocks\[0\]\.history\[0\] is an int, not a history entry",
    ),
    "entry without action": (
        lambda d: _entry(d).pop("action"),
        r"device_traces\[0\]\[1\] has no 'action' key",
    ),
    "time past 2**53": (
        lambda d: _entry(d).update(time_us=2**53),
        r"device_traces\[0\]\[1\]\.time_us is an int of",
    ),
    "line past 2**31": (
        lambda d: _entry(d)["frames"][-1].update(line=2**31),
        r"device_traces\[0\]\[1\]\.frames\[2\]\.line is an int of 2\*\*31 or more",
    ),
    "a trace a dict": (lambda d: d["device_traces"].append({}), r"device_traces\[1\] is a dict, not a list"),
    "settings a list": (
        lambda d: d.update(allocator_settings=[1]),
        "allocator_settings is a list, not a dict",
    ),
    "no segments": (lambda d: d.pop("segments"), "no 'segments' key at the top level"),
}


@pytest.mark.parametrize("change", VARIANTS)
@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL])
def test_the_scan_past_the_budget_agrees_with_the_loader(change: str, protocol: int) -> None:
    mutate, refused = VARIANTS[change]
    data = _two_segments()
    mutate(data)
    raw = pickle.dumps(data, protocol=protocol)
    if refused is None:
        assert loads_snapshot(raw, "s", **sf.tripped()) == loads_snapshot(raw, "s", memory_budget=None)
        return
    with pytest.raises(UsageError, match="^s: not a memory snapshot: "):
        loads_snapshot(raw, "s", memory_budget=None)
    with pytest.raises(UsageError, match=rf"^s: not a memory snapshot: {refused}"):
        loads_snapshot(raw, "s", **sf.tripped())


def test_the_scan_refuses_a_list_under_a_key_read_only_elsewhere() -> None:
    """Stricter than the loader, which ignores it: a segment's ``history`` (a block's
    key) holding a list. Its size would be unchecked, and torch never writes it."""
    data = _two_segments()
    _seg(data)["history"] = [{"frames": []}]
    raw = pickle.dumps(data)
    assert len(loads_snapshot(raw, "s", memory_budget=None).segments) == 2
    with pytest.raises(
        UsageError, match=r"segments\[1\]\.history is a list, where a segment has no list or dict$"
    ):
        loads_snapshot(raw, "s", **sf.tripped())
