"""The guarded readers (``inputs``, ``snapshots.load``, ``csvrows``): bounded in bytes,
depth and digits, only regular files, one ``BadInput`` line and exit 2 from every
command, nothing written on error (issue 16, items 7, 8 and 10)."""

from __future__ import annotations

import copy
import gzip
import os
import pickle
import signal
from pathlib import Path

import pytest
import snapshotfiles as sf

from gpu_mem_track import inputs
from gpu_mem_track.errors import BadInput, UsageError
from gpu_mem_track.snapshotfile import load as snapshot_load
from gpu_mem_track.snapshotfile import load_snapshot

MIB = sf.MIB


def small_snapshot() -> dict:
    seg = sf.segment(sf.BASE, [(512, 4, "active_allocated"), (2 * MIB - 512, 0, "inactive")], "small")
    return sf.snapshot([seg], [sf.entry("alloc", sf.BASE, 512, 1_700_000_000_000_000)])


def one_line_exit_2(done, *expected: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    for text in expected:
        assert text in done.stderr


def test_bad_input_is_the_usage_error_the_cli_maps_to_exit_2() -> None:
    assert issubclass(BadInput, UsageError)


# -- item 7: bounded reads, no hang ---------------------------------------------------


class Hung(Exception):
    pass


@pytest.fixture
def no_hang():
    """Turn a read that would block forever into a failure after 10 s (SIGALRM
    interrupts the blocking open or read; the handler raises)."""

    def hung(signum, frame):
        raise Hung("a blocking read: the FIFO was opened or read as a file")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("snapshot", "snap.pickle"),
        ("show", "report.csv"),
        ("compare", "timeline.csv"),
        ("plot", "lines.csv"),
        ("html", "tracker.csv"),
    ],
)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, in_process, no_hang, command, name):
    path = tmp_path / name
    os.mkfifo(path)  # nobody ever writes: a blocking open or read would hang the test
    args = (
        [command, path]
        + ([path] if command == "compare" else [])
        + ["--out-dir", tmp_path / "out"] * (command == "snapshot")
    )
    one_line_exit_2(in_process(*args), f"{path}: a FIFO")
    assert not (tmp_path / "out").exists()


def test_a_fifo_meta_json_is_refused(tmp_path, in_process, no_hang):
    folder = tmp_path / "run"
    folder.mkdir()
    os.mkfifo(folder / "meta.json")
    one_line_exit_2(in_process("show", folder), "meta.json: a FIFO")


def test_dev_zero_is_refused_before_reading(in_process, tmp_path, no_hang):
    done = in_process("snapshot", "/dev/zero", "--out-dir", tmp_path)
    one_line_exit_2(done, "/dev/zero: a character device")
    one_line_exit_2(in_process("show", "/dev/zero"), "/dev/zero: a character device")
    assert list(tmp_path.iterdir()) == []


def test_a_gzip_that_expands_past_the_limit_is_refused(tmp_path, in_process, monkeypatch):
    raw = pickle.dumps(small_snapshot())
    path = tmp_path / "bomb.pickle.gz"
    path.write_bytes(gzip.compress(raw + b"\0" * (8 * MIB)))  # 8 MiB of zeros after the pickle
    assert path.stat().st_size < 64 * 1024
    monkeypatch.setattr(snapshot_load, "MAX_BYTES", MIB)
    done = in_process("snapshot", path, "--out-dir", tmp_path / "out")
    one_line_exit_2(done, f"{path}: expands past 1,048,576 bytes when gunzipped")
    assert not (tmp_path / "out").exists()


def zeros_bomb(path: Path) -> Path:
    """A gzipped snapshot that expands to over 8 MiB (zeros after the pickle)."""
    path.write_bytes(gzip.compress(pickle.dumps(small_snapshot()) + b"\0" * (8 * MIB)))
    return path


def test_max_bytes_sets_the_snapshot_bound_and_a_refusal_names_it(tmp_path, in_process) -> None:
    path = zeros_bomb(tmp_path / "long.pickle.gz")
    done = in_process("snapshot", path, "--out-dir", tmp_path / "out", "--max-bytes", "1MiB")
    one_line_exit_2(done, f"{path}: expands past 1,048,576 bytes when gunzipped", "--max-bytes SIZE")
    assert not (tmp_path / "out").exists()
    done = in_process("snapshot", path, "--out-dir", tmp_path / "out", "--max-bytes", "16MiB")
    assert done.returncode == 0, done.stderr
    plain = tmp_path / "plain.pickle"
    plain.write_bytes(pickle.dumps(small_snapshot()) + b"\0" * 2048)
    done = in_process("snapshot", plain, "--out-dir", tmp_path / "out2", "--max-bytes", "1KiB")
    one_line_exit_2(done, f"{plain}: larger than 1,024 bytes, the most read as a memory snapshot; --max")


def test_html_of_a_snapshot_takes_max_bytes(tmp_path, in_process) -> None:
    path = zeros_bomb(tmp_path / "long.pickle.gz")
    page = tmp_path / "page.html"
    done = in_process("html", path, "-o", page, "--max-bytes", "1MiB")
    one_line_exit_2(done, f"{path}: expands past 1,048,576 bytes when gunzipped", "--max-bytes SIZE")
    assert not page.exists()
    assert in_process("html", path, "-o", page, "--max-bytes", "0.5GiB").returncode == 0
    assert page.is_file()


def test_max_bytes_reads_sizes_as_the_cli_does_and_defaults_to_4_gib(in_process) -> None:
    from gpu_mem_track.commands import byte_size

    assert byte_size("8GiB") == 8 * 2**30 and byte_size("1.5GB") == 1_500_000_000
    assert snapshot_load.MAX_BYTES == 4 * 2**30
    for bad in ("0", "-5GiB", "lots"):
        done = in_process("snapshot", "x.pickle", "--max-bytes", bad)
        assert done.returncode == 2 and "argument --max-bytes" in done.stderr


def test_gunzip_stops_at_the_limit_and_reads_what_fits() -> None:
    data = gzip.compress(b"x" * 1000) + gzip.compress(b"y" * 10)
    assert inputs.gunzip(data, 1010, "two members") == b"x" * 1000 + b"y" * 10
    with pytest.raises(BadInput, match="expands past 1,009 bytes"):
        inputs.gunzip(data, 1009, "two members")
    with pytest.raises(BadInput, match="truncated or corrupt gzip"):
        inputs.gunzip(data[:20], 10_000, "cut")


def test_a_file_over_the_byte_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    assert inputs.read_bytes(path, 101, "a thing") == b"x" * 101
    with pytest.raises(BadInput, match=r"big: larger than 100 bytes, the most read as a thing"):
        inputs.read_bytes(path, 100, "a thing")


# -- item 8: huge integers, non-UTF-8 names ------------------------------------------------

HUGE = 10**5000  # more digits than Python converts to text (4,300)


def _with(path: tuple, value) -> dict:
    data = copy.deepcopy(small_snapshot())  # sf.SETTINGS's inner dicts are shared
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("where", "named"),
    [
        (("segments", 0, "blocks", 0, "size"), "segments[0].blocks[0]"),
        (("segments", 0, "address"), "segments[0]"),
        (("segments", 0, "total_size"), "segments[0]"),
        (("device_traces", 0, 0, "time_us"), "device_traces[0][0]"),
        (("device_traces", 0, 0, "addr"), "device_traces[0][0]"),
        (("device_traces", 0, 0, "size"), "device_traces[0][0]"),
        (("allocator_settings", "max_split_size"), "'allocator_settings'"),
        (("allocator_settings", "roundup_power2_divisions", "1"), "'allocator_settings'"),
    ],
)
def test_integers_over_4300_digits_are_one_line_and_nothing_written(tmp_path, in_process, where, named):
    path = sf.write(tmp_path / "huge.pickle", _with(where, HUGE))
    done = in_process("snapshot", path, "--out-dir", tmp_path / "out")
    one_line_exit_2(done, f"{path}: not a memory snapshot: {named}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "12", 2**64])
def test_sizes_must_be_whole_numbers_in_range(value) -> None:
    with pytest.raises(BadInput, match=r"segments\[0\]\.blocks\[0\] is malformed"):
        snapshot_load.snapshot_from_data(_with(("segments", 0, "blocks", 0, "size"), value), "s")


def test_settings_nested_too_deep_are_refused() -> None:
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(BadInput, match="nested deeper than 32 levels"):
        snapshot_load.snapshot_from_data(_with(("allocator_settings", "extra"), deep), "s")


def test_non_utf8_names_are_kept_escaped_through_snapshot_show_and_html(tmp_path, in_process):
    data = small_snapshot()
    data["segments"][0]["blocks"][0]["frames"][-1].update(filename="/src/tr\udcffain.py", name=b"st\xffep")
    data["device_traces"][0][0]["frames"][-1].update(filename="/src/tr\udcffain.py", name=b"st\xffep")
    path = sf.write(tmp_path / "names.pickle", data)
    snap = load_snapshot(path)
    frame = snap.segments[0].blocks[0].frames[-1]
    assert (frame.filename, frame.name) == ("/src/tr\\udcffain.py", "st\\xffep")
    done = in_process("snapshot", path, "--out-dir", tmp_path / "out", "--name", "n")
    assert done.returncode == 0, done.stderr
    shown = in_process("show", tmp_path / "out" / "n")
    assert shown.returncode == 0, shown.stderr
    page = in_process("html", tmp_path / "out" / "n", "-o", tmp_path / "n.html")
    assert page.returncode == 0, page.stderr
    assert "udcffain.py" in (tmp_path / "n.html").read_text(encoding="utf-8")
