"""MemTracker under faults and odd input: shutdown, planted links, concurrent writers, labels."""

from __future__ import annotations

import csv
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gpu_mem_track import read_stamps
from gpu_mem_track.tracker.options import label_text

ROOT = Path(__file__).resolve().parents[1]


def _python(script: Path, cwd: Path, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_track_in_a_destructor_at_interpreter_shutdown_writes_its_stamp(tmp_path):
    script = tmp_path / "shutdown.py"
    script.write_text(
        textwrap.dedent(
            """
            import pathlib
            import sys

            import torch
            from gpu_mem_track import MemTracker

            tracker = MemTracker(probe=False, device="cpu", run_name="bye")

            def no_import(*args):
                raise ImportError("sys.meta_path is None, Python is likely shutting down")

            class Holder:
                def __del__(self, path_class=pathlib.PurePath, version=sys.version_info):
                    # Python 3.12.3's pathlib imports while it makes a Path, which fails
                    # once sys.meta_path is None: make every 3.12+ do the same here.
                    if version >= (3, 12):
                        path_class.__init__ = no_import
                    tracker.track("in del")

            holder = Holder()
            x = torch.zeros(10)
            tracker.track("main")
            """
        )
    )
    done = _python(script, tmp_path)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert "[in del]" in out
    assert [s.label for s in read_stamps(tmp_path / "reports" / "bye.csv")] == ["main", "in del"]


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="needs POSIX symbolic links")
def test_planted_links_in_the_reports_folder_are_never_followed(quiet_tracker, tmp_path, capsys):
    reports = tmp_path / "reports"
    reports.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (reports / "evil.csv").symlink_to(outside / "stolen.csv")  # dangling: exists() says False
    (reports / "evil.log").symlink_to(outside / "stolen.log")
    tracker = quiet_tracker(run_name="evil")
    tracker.track("one")
    assert tracker.run_name == "evil-2"
    assert list(outside.iterdir()) == []
    assert [s.label for s in read_stamps(reports / "evil-2.csv")] == ["one"]
    # a link swapped in after the files were created is refused, not written through
    tracker.files.csv.unlink()
    tracker.files.csv.symlink_to(outside / "late.csv")
    capsys.readouterr()
    assert tracker.track("two").label == "two"  # the stamp goes on, its files stop
    assert list(outside.iterdir()) == []
    assert capsys.readouterr().err.startswith("gpu_mem_track: cannot write reports to ")


def test_two_processes_with_one_run_name_write_two_reports(tmp_path):
    script = tmp_path / "same.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from pathlib import Path
            from gpu_mem_track import MemTracker

            go = Path(sys.argv[1])
            while not go.exists():
                time.sleep(0.001)
            tracker = MemTracker(probe=False, device="cpu", run_name="same", verbosity=0)
            for _ in range(30):
                tracker.track()
            print(tracker.run_name)
            """
        )
    )
    go = tmp_path / "go"
    workers = [_python(script, tmp_path, str(go)) for _ in range(4)]
    go.touch()
    names = []
    for worker in workers:
        out, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err
        names.append(out.strip())
    assert sorted(names) == ["same", "same-2", "same-3", "same-4"]
    for name in names:
        with open(tmp_path / "reports" / f"{name}.csv", newline="", encoding="utf-8") as handle:
            rows = [row for row in csv.DictReader(handle) if row["row"] == "totals"]
        assert [int(row["seq"]) for row in rows] == list(range(1, 31))


def test_a_name_claimed_by_another_process_after_our_check_is_left_alone(
    quiet_tracker, tmp_path, monkeypatch
):
    """The race made deterministic: another tracker creates ``same.csv``/``same.log`` just
    after this one looked (``Path.exists`` answers as it would have a moment earlier)."""
    reports = tmp_path / "reports"
    reports.mkdir()
    theirs = b"seq,time\n1,2\n"
    (reports / "same.csv").write_bytes(theirs)
    (reports / "same.log").write_bytes(b"theirs\n")
    monkeypatch.setattr(Path, "exists", lambda self, **kwargs: False)
    tracker = quiet_tracker(run_name="same")
    tracker.track()
    assert tracker.run_name == "same-2"
    assert (reports / "same.csv").read_bytes() == theirs
    assert (reports / "same.log").read_bytes() == b"theirs\n"


def test_a_full_disk_stops_the_report_files_not_the_program(tmp_path):
    script = tmp_path / "full.py"
    script.write_text(
        textwrap.dedent(
            """
            from gpu_mem_track import MemTracker

            tracker = MemTracker(probe=False, device="cpu", run_name="full", verbosity=0)
            stamps = [tracker.track(f"step {i}") for i in range(300)]
            print(len(stamps), stamps[-1].label)
            """
        )
    )

    def limit() -> None:  # files over 16 KiB: EFBIG, as a full disk gives ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))

    done = _python(script, tmp_path, preexec_fn=limit)
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    assert out == "300 step 299\n"
    assert err.count("gpu_mem_track: cannot write reports to ") == 1 and "Traceback" not in err
    notes: list[str] = []
    kept = read_stamps(tmp_path / "reports" / "full.csv", notes)
    assert 0 < len(kept) < 300 and kept[0].label == "step 0"


class _BadStr:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@pytest.mark.parametrize(
    ("label", "text"),
    [
        (None, ""),
        (123, "123"),
        (0, "0"),
        (False, "False"),
        (b"", "b''"),
        (["a", 1], "['a', 1]"),
        (_BadStr(), "<_BadStr>"),
        # tensors made in the test: made at collection, they would live through every test
        (lambda: torch.tensor(3), "3"),
        (lambda: torch.zeros(2, 3), "tensor(2x3, float32, cpu)"),
        (lambda: torch.zeros(3, device="meta"), "tensor(3, float32, meta)"),
        ("step\udcff", "step\\udcff"),
    ],
)
def test_any_label_becomes_text(label, text):
    if callable(label) and label.__name__ == "<lambda>":
        label = label()
    assert label_text(label) == text


def test_odd_labels_are_stamped_and_read_back(quiet_tracker):
    tracker = quiet_tracker(run_name="labels")
    labels = [123, b"", ["x"], torch.ones(2, 2), "lone\udcff", 0, False]
    for label in labels:
        tracker.track(label)
    with tracker.region(7):
        pass
    stamps = read_stamps(tracker.files.csv)
    assert [s.label for s in stamps] == [
        "123",
        "b''",
        "['x']",
        "tensor(2x2, float32, cpu)",
        "lone\\udcff",
        "0",
        "False",
        "7 start",
        "7 end",
    ]
