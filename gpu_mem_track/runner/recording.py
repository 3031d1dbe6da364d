"""``run --snapshot``: record the CUDA allocator's history while the script runs, keep
the snapshot in the run folder, analyse it as the ``snapshot`` command does
(``snapshot_lines.csv``, ``snapshot.json``, and its text report as
``snapshot_report.txt``) and merge its exact peaks into the line records (``peaks``).

``SnapshotRun.start`` runs before the script's first line, ``finish`` after its last
(also after an exception, ``sys.exit``, Ctrl-C or SIGTERM); ``finish`` never raises:
whatever goes wrong after the script ends becomes the ``note`` of its ``SnapshotMerge``,
and the run's own reports are written as without ``--snapshot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..devices import Device
from ..runfolder.records import LineRecord, SnapshotMerge
from .history import HistoryRecorder, LineWindows
from .peaks import Window
from .profiler import function_name

__all__ = ["SNAPSHOT_FILE", "SnapshotRun"]

#: The snapshot's name in the run folder.
SNAPSHOT_FILE = "snapshot.pickle"


class SnapshotRun:
    """One run's recording and its merge.

    ``history``: the recorder (``history.TorchHistory`` on a GPU, a fake in tests);
    ``sampler``: the run's CUDA sampler (its ``events`` count numbers the trace's
    entries); ``folder``: the run folder; ``device``: the CUDA device; ``entries``: trace
    entries kept; ``include``: files and folders whose frames count as user code besides
    the script's (see ``snapshots.attribution``). ``windows`` goes to the line profiler;
    ``result`` is set by ``finish``.
    """

    def __init__(
        self,
        history: HistoryRecorder,
        sampler: Any,
        folder: Path,
        device: Device,
        entries: int,
        include: Sequence[str] = (),
    ) -> None:
        self.history = history
        self.sampler = sampler
        self.folder = Path(folder)
        self.device = device.ordinal
        self.entries = entries
        self.include = tuple(include)
        self.windows = LineWindows(entries)
        self.result: SnapshotMerge | None = None
        self._start = (0, 0)

    def start(self) -> None:
        """Start recording (or arm it for when the script starts CUDA)."""
        self.history.start(self.entries)
        self._start = self._read()

    def finish(self, records: Sequence[LineRecord]) -> list[LineRecord]:
        """Dump the snapshot, stop recording, and return the records with the trace's
        peaks (unchanged when nothing could be merged; ``result`` says why)."""
        end = self._read()
        path = self.folder / SNAPSHOT_FILE
        note = ""
        try:
            written = self.history.dump(path)
        except Exception as exc:  # noqa: BLE001 - a note in the report, not a lost run
            written, note = False, f"could not write {SNAPSHOT_FILE}: {exc}"
        finally:
            self.history.stop()
        if not written:
            note = note or self.history.note or "the script never started CUDA, so nothing was recorded"
            self.result = SnapshotMerge("", device=self.device, note=note)
            return list(records)
        try:
            merged, self.result = self._merge(path, records, end)
        except Exception as exc:  # noqa: BLE001 - as above
            self.result = SnapshotMerge(
                SNAPSHOT_FILE, device=self.device, note=f"could not analyse it: {exc}"
            )
            return list(records)
        return merged

    def _read(self) -> tuple[int, int]:
        """(the allocator's event count, allocated bytes) now."""
        current, _ = self.sampler.sample()
        return self.sampler.events, current

    def _merge(
        self, path: Path, records: Sequence[LineRecord], end: tuple[int, int]
    ) -> tuple[list[LineRecord], SnapshotMerge]:
        from ..allocator.replay import replay
        from ..snapshotfile.load import load_snapshot
        from .peaks import alignment_note, counted_levels, counted_positions, merge_peaks, window_peaks

        snapshot = load_snapshot(path)
        device = self.device
        trace = snapshot.device_traces[device] if device < len(snapshot.device_traces) else ()
        positions = counted_positions(trace)
        counted, first = end[0] - self._start[0], end[0] - len(positions)
        replayed = replay(snapshot, device)
        levels = counted_levels(replayed)
        note = alignment_note(replayed, levels, counted, self._start[1], end[1])
        if counted and not positions:
            note = f"the snapshot holds no trace for cuda:{device}"
        base = SnapshotMerge(SNAPSHOT_FILE, device, len(trace), counted, len(positions), len(records))
        windows = self._windows()
        peaks, outside, mismatched = window_peaks(windows, levels, first, replayed.start_allocated)
        if mismatched and not note:
            note = f"{mismatched} of {len(windows)} line runs began or ended at bytes other than the replay's"
        if note:  # the analysis by stacks still holds; the placement by count does not
            self._write_analysis(snapshot, replayed)
            return list(records), replace(base, note=note)
        for key, count in self._forgotten().items():
            outside[key] = outside.get(key, 0) + count
        placed = self._analyse_placed(snapshot, windows, positions, first)
        merged = merge_peaks(records, peaks, outside)
        raised = sum(new.peak > old.peak for new, old in zip(merged, records))
        exact = sum(r.peak_exact for r in merged)
        return merged, replace(base, exact=exact, raised=raised, outside=sum(outside.values()), placed=placed)

    def _analyse_placed(self, snapshot: Any, windows: list[Window], positions: list[int], first: int) -> int:
        """Write the analysis of the snapshot whose stackless entries were given the line
        that ran them; returns how many were."""
        from ..allocator.replay import replay
        from .peaks import innermost_lines, place_frameless

        owners = innermost_lines(windows, first, len(positions))
        placed_snapshot, placed = place_frameless(snapshot, self.device, positions, owners)
        self._write_analysis(placed_snapshot, replay(placed_snapshot, self.device))
        return placed

    def _write_analysis(self, snapshot: Any, replayed: Any) -> None:
        from ..snapshots.analyse import analyse
        from ..snapshots.attribution import Attributor
        from ..snapshots.folder import write_snapshot_files
        from ..snapshots.report import render_report

        analysis = analyse(snapshot, replayed, Attributor(self.include))
        write_snapshot_files(self.folder, analysis)
        text = render_report(analysis, f"{self.folder.name}/{SNAPSHOT_FILE}")
        (self.folder / "snapshot_report.txt").write_text(text, encoding="utf-8")

    def _windows(self) -> list[Window]:
        return [(_key(code, line), *counts) for code, line, *counts in self.windows]

    def _forgotten(self) -> dict[tuple[str, str, int], int]:
        out: dict[tuple[str, str, int], int] = {}
        for (code, line), count in self.windows.forgotten.items():
            key = _key(code, line)
            out[key] = out.get(key, 0) + count
        return out


def _key(code: Any, line: int) -> tuple[str, str, int]:
    """A line as ``LineRecord`` names it (``profiler.LineProfiler.records``)."""
    return code.co_filename, function_name(code), line
