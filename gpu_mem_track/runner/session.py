"""The run's stamp listener: trackers in the script write into the run, and the runner's
own tracker takes the automatic censuses.

``RunSession`` is registered with ``tracker.listeners.add_stamp_listener`` while the
script runs: a ``MemTracker`` the script creates with the default output folder writes
into the run folder, and each of its stamps becomes a ``track`` timeline row. The
automatic census after a line goes through one tracker of the runner's own
(``census.log``/``census.csv``) with the public ``MemTracker.stamp_at``; its stamps are
kept (``censuses``) for the report. Torch and the tracker load on the first census only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import CodeType
from typing import Any

from ..devices import Device
from ..runfolder.files import TimelineWriter
from .profiler import function_name

__all__ = ["CENSUS_PER_LINE", "CENSUS_PER_RUN", "RunSession"]

#: Automatic censuses per line and per run: enough to see what a line creates, bounded.
CENSUS_PER_LINE, CENSUS_PER_RUN = 2, 50


class RunSession:
    """One run's listener (``tracker.listeners.StampListener``) and census taker.

    ``folder``: the run folder; ``device``: the run's resolved device (a ``Device``, or
    its text ``cpu``, ``cuda:N``), or the sampler whose ``device`` names it once known (a rank's device is
    decided when the script starts CUDA); ``profiler``: set once made, receives the
    timeline rows. ``censuses`` holds the automatic censuses' stamps
    (``tracker.records.Stamp``), in order; ``marks`` the label of each stamp of the
    script's trackers with the run's peak (bytes) before it, in order (see
    :meth:`peak_phase`).
    """

    def __init__(self, folder: Path, device: Any, timeline: TimelineWriter) -> None:
        self.folder: Path | None = folder
        self._device = device
        self.timeline = timeline
        self.profiler: Any = None
        self.censuses: list[Any] = []
        self.marks: list[tuple[str, int]] = []
        self._tracker: Any = None
        self._per_line: dict[tuple[CodeType, int], int] = {}
        #: The script's module (or globals), kept until the reports are written, as python
        #: keeps a script's globals until it exits (``launch.run_script`` fills it).
        self.script_globals: list[Any] = []
        #: Why the automatic censuses (census.csv) could not be written (a full disk), or "": then
        #: none is taken any more; the script never sees our error.
        self.write_error = ""

    def on_stamp(self, tracker: Any, stamp: Any) -> None:
        """A tracker stamped: a ``track`` row (or a ``census`` row for the runner's own)."""
        if self.profiler is None:
            return
        event = "census" if tracker is self._tracker else "track"
        self.profiler.event_row(event, stamp.label, (stamp.file, stamp.function, stamp.line))
        if event == "census":
            self.censuses.append(stamp)
        else:
            self.marks.append((stamp.label, self.profiler.peak))

    @property
    def device(self) -> str:
        """The run's device (``cpu``, ``cuda:N``), as far as known now."""
        if isinstance(self._device, (str, Device)):
            return str(self._device)
        return self._device.device

    def peak_phase(self, peak: int) -> str:
        """The label of the last stamp of the script's trackers before the run reached
        ``peak`` bytes ("" when the peak came before any stamp). The run's peak only
        rises, so the stamps taken before it are those that saw a lower one."""
        before = [label for label, seen in self.marks if seen < peak]
        return before[-1] if before else ""

    def census(self, code: CodeType, lineno: int, increment: int) -> None:
        """Census after a line whose execution grew memory by ``increment`` bytes (the
        profiler's callback; called from inside the traced frame's callees)."""
        from ..errors import UsageError
        from ..units import format_bytes

        key = (code, lineno)
        done = self._per_line.get(key, 0)
        if done >= CENSUS_PER_LINE or len(self.censuses) >= CENSUS_PER_RUN or self.write_error:
            return
        self._per_line[key] = done + 1
        frame = sys._getframe(1)
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        where = (code.co_filename, lineno, function_name(code))
        try:
            tracker = self.census_tracker()
            tracker.stamp_at(frame, f"line {lineno} grew {format_bytes(increment)}", where=where)
        except OSError as exc:  # our files (a full disk): never an error of the script's
            self.write_error = exc.strerror or str(exc)
        except UsageError as exc:  # the census files could not be created
            self.write_error = str(exc)
        finally:
            del frame

    def census_tracker(self, activations: bool = False) -> Any:
        """The runner's own tracker (``census.log``/``.csv``), made on first use."""
        if self._tracker is None:
            from ..tracker.memtracker import MemTracker

            self._tracker = MemTracker(
                device=self.device,
                out_dir=self.folder,
                run_name="census",
                verbosity=0,
                probe=False,  # no second CUDA context in the middle of the user's script
                activations=activations,
            )
        return self._tracker

    def close(self) -> None:
        """Stop recording saved activations, if the census tracker was."""
        if self._tracker is not None:
            self._tracker.close()
