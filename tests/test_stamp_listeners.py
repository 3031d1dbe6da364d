"""The public stamp hook: listeners, ``MemTracker.stamp_at``, and the runner using them."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
import torch

from gpu_mem_track import MemTracker
from gpu_mem_track.errors import UsageError
from gpu_mem_track.runfolder.files import read_timeline
from gpu_mem_track.runner.options import RunOptions
from gpu_mem_track.runner.result import RunResult
from gpu_mem_track.runner.run import execute, prepare
from gpu_mem_track.tracker import listeners
from gpu_mem_track.tracker.listeners import add_stamp_listener, listening, remove_stamp_listener


class Recorder:
    def __init__(self, folder=None):
        self.folder = folder
        self.seen = []

    def on_stamp(self, tracker, stamp):
        self.seen.append((tracker, stamp.label))


def test_a_listener_hears_every_stamp_until_removed(quiet_tracker):
    tracker, recorder = quiet_tracker(), Recorder()
    add_stamp_listener(recorder)
    add_stamp_listener(recorder)  # once only
    try:
        tracker.track("one")
        with tracker.region("block"):
            pass
    finally:
        remove_stamp_listener(recorder)
    tracker.track("unheard")
    assert recorder.seen == [(tracker, "one"), (tracker, "block start"), (tracker, "block end")]
    assert listeners._listeners == []


def test_a_listener_folder_takes_the_default_output_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    with listening(Recorder(run_folder)) as recorder:
        tracker = MemTracker(device="cpu", verbosity=0, probe=False)
        explicit = MemTracker(device="cpu", verbosity=0, probe=False, out_dir=tmp_path / "mine")
        tracker.track("here")
    assert tracker.files.csv.parent == run_folder and tracker.run_name == "tracker"
    assert explicit.files.csv.parent == tmp_path / "mine"
    assert not (tmp_path / "reports").exists()
    assert recorder.seen == [(tracker, "here")]
    after = MemTracker(device="cpu", verbosity=0, probe=False)
    assert after.files.csv.parent == Path("reports")


def test_stamp_at_names_the_given_frame_and_records_where(quiet_tracker):
    tracker = quiet_tracker()
    tracker.track("before")
    # A frame of someone else's code, whose names (its globals; locals too on 3.13+) are not ours.
    namespace = {"torch": torch}
    exec("import sys\nobserved_weights = torch.ones(64, 64)\nframe = sys._getframe(0)", namespace)
    frame = namespace.pop("frame")
    try:
        stamp = tracker.stamp_at(frame, "observed", where=("model.py", 12, "build"))
        default = tracker.stamp_at(frame, "at the frame")
    finally:
        del frame
    assert (stamp.file, stamp.line, stamp.function, stamp.label) == ("model.py", 12, "build", "observed")
    grown = [change for change in stamp.changes if change.shape == (64, 64)]
    assert grown and grown[0].names == ("observed_weights",)
    assert (default.file, default.line, default.function) == ("<string>", 3, "<module>")
    with pytest.raises(UsageError, match="needs a frame or a where"):
        tracker.stamp_at(None, "nowhere")


def test_execute_returns_its_censuses_and_the_script_trackers_become_track_rows(
    tmp_path, monkeypatch, fresh_heap
):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from gpu_mem_track import MemTracker

            tracker = MemTracker(verbosity=0, probe=False)
            tracker.track("start")
            big = torch.ones(4096, 4096)
            tracker.track("after big")
            """
        )
    )
    options = RunOptions(
        str(script), out_dir=str(tmp_path / "out"), run_name="r", device="cpu", census_threshold=16 * 2**20
    )
    prepared = prepare(options)
    before = repr(prepared)
    summary = io.StringIO()
    result = execute(prepared, stream=summary)
    assert isinstance(result, RunResult) and result.exit_code == 0
    assert repr(prepared) == before and result.folder == prepared.folder.path
    assert result.censuses and all(c.label.startswith("line ") for c in result.censuses)
    assert 7 in [c.line for c in result.censuses]
    timeline = list(read_timeline(result.folder / "timeline.csv"))
    assert [row.label for row in timeline if row.event == "track"] == ["start", "after big"]
    assert [row.label for row in timeline if row.event == "census"] == [c.label for c in result.censuses]
    assert (result.folder / "tracker.csv").exists() and not (tmp_path / "reports").exists()
    assert result.info.exit_code == 0 and result.records
    assert listeners._listeners == []
    assert f"{result.folder.name}/ (report.txt" in summary.getvalue()  # the folder, relative to the cwd
