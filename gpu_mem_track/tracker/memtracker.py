"""``MemTracker``: line-stamped reports of live tensors and where device memory goes.

Each ``track()`` call takes a census of live tensors on the tracked device, reads the
allocator, the driver and the process, and writes one stamp: a line with totals, the
reconciliation ledger, and the tensor groups that appeared (``+``) or disappeared
(``-``) since the previous call. Reports go to the stream (stdout by default), to a text
log and to a CSV under the output folder, flushed at every call. When those files cannot
be written any more (a full disk), one line on stderr says so, what was written is kept,
and the stamps go on (returned, printed, heard by listeners): the program never fails
because of its reports.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import platform
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, TypeVar

import torch

from .._version import __version__
from ..devices import Device, parse_device
from ..errors import UsageError
from ..outputs import ReportFiles, default_run_name, open_append
from ..ranks import launch_name, rank_device, rank_info
from .bulk import CensusMemo
from .census import TensorSource, take_census
from .classic import ClassicMethods
from .csvlog import append_stamp, read_frame, stamp_rows, write_header
from .finder import FullScan, LiveTensorFinder
from .listeners import notify, redirected_folder
from .naming import Registry, frame_roots, merge_roots
from .options import (
    PROBE_HINT,
    Probe,
    check_options,
    cuda_unavailable_note,
    cuda_usable,
    label_text,
    probe_function,
)
from .probe import ProbeError
from .readers import MemoryReader, reader_for
from .records import Census, Ledger, Stamp, diff_census
from .render import render_census, render_header, render_stamp
from .saved import SavedTensorRecorder

__all__ = ["MemTracker"]

F = TypeVar("F", bound=Callable[..., Any])


class MemTracker(ClassicMethods):
    """Line-stamped live-tensor reports that add up, byte for byte.

    ``MemTracker()`` needs no arguments; the classic ``MemTracker(inspect.currentframe())``
    and ``MemTracker(detail, path, verbose, device)`` forms work too (the frame is not
    needed: each ``track()`` reads its caller's frame itself). The classic helpers
    ``get_tensors``, ``get_tensor_usage``, ``get_allocate_usage``, ``clear_cache`` and
    ``print_all_gpu_tensor`` are there too (see ``classic.ClassicMethods``).

    Args:
        frame: accepted for compatibility with the classic tool; ignored.
        detail: list changed tensor groups (True) or print totals only (False).
        path: the classic name of ``out_dir``.
        verbose: the classic switch; True means ``verbosity=2``.
        device: ``"cuda:1"``, ``"cuda"``, ``"cpu"``, a ``torch.device`` or a CUDA index.
            Default: the current CUDA device when CUDA is available, else the CPU; in a
            distributed launch, the rank's device (``ranks.rank_device``: the current one
            when the script chose it, else ``cuda:<LOCAL_RANK>``). A CUDA device asked for
            where CUDA is not available is reported on the CPU instead, with a note saying
            so (unless ``reader`` is given: it stands for the device).
        out_dir: folder of the text log and CSV (created if missing); None writes no files.
            In a distributed launch (``ranks.rank_info``) the files go to
            ``<out_dir>/<launch>/rank<k>/`` (``ranks.launch_name``), the folder every rank
            of the launch shares (a folder already named ``rank<k>`` is used as it is).
        run_name: base name of the report files; default ``<script>-<date>-<time>``
            (``tracker`` in a launch folder).
        verbosity: 0 prints nothing, 1 prints each stamp, 2 also lists every live group.
            Default 1, and 0 on the ranks other than 0 of a distributed launch.
        stream: where stamps are printed (default: ``sys.stdout`` at call time).
        probe: split the framework cost with the CUDA context cost measured for this GPU
            by ``gpu-mem-track probe`` (True: read from the probe's cache; when there is
            none, a note says once how to measure it; nothing is ever measured from here),
            skip it (False), or a callable ``device -> ProbeResult | None``.
        census: ``"fast"`` (``census.LiveTensorFinder``: a heap walk at the first call and
            after a collection it did not see, else a scan of the young objects) or
            ``"full"`` (filter all of ``gc.get_objects()``; slower, to check the fast one).
        reader: the memory reader (default: CUDA allocator + NVML, or process RSS on CPU).
        source: the object source for the census (default: per ``census``). A source with
            a ``roots()`` method (``finder.LiveTensorFinder``, ``finder.FullScan``) also
            gives the live models and optimizers it met, which name parameters and
            optimizer state without ``watch()``.
        clock: the wall clock, seconds since the epoch.
        activations: record the tensors autograd saves for backward (category
            ``Activation``, named ``saved at file:line (module)``) and the inputs of watched
            models (``Input``) from now until ``close()``; ``saved_activations()`` records
            for one block instead. See ``saved.SavedTensorRecorder``.
    """

    def __init__(
        self,
        frame: Any = None,
        detail: bool = True,
        path: str | Path | None = None,
        verbose: bool = False,
        device: str | int | torch.device | Device | None = None,
        *,
        out_dir: str | Path | None = "reports",
        run_name: str | None = None,
        verbosity: int | None = None,
        stream: TextIO | None = None,
        probe: bool | Probe = True,
        census: str = "fast",
        reader: MemoryReader | None = None,
        source: TensorSource | None = None,
        clock: Callable[[], float] = time.time,
        activations: bool = False,
    ) -> None:
        if isinstance(frame, bool):  # the classic MemTracker(detail, path, verbose, device)
            frame, detail, path, verbose, device = None, frame, detail, path, verbose  # type: ignore[assignment]
        self.rank = rank_info()
        if verbosity is None:
            verbosity = 0 if self.rank is not None and not self.rank.is_first else 1
        check_options(frame, census, verbosity)
        self.detail = detail
        self.verbosity = 2 if verbose else verbosity
        self._device: Device | None = None if device is None else parse_device(device)
        self._stream = stream
        self._probe: Probe | None = probe_function(probe)
        self._source = source or (FullScan() if census == "full" else LiveTensorFinder())
        self._reader = reader
        self._reader_given = reader is not None
        self._clock = clock
        self._registry = Registry()
        self._memo = CensusMemo()
        self._recorder = SavedTensorRecorder()
        self._recording = activations
        if activations:
            self._recorder.install()
        self._previous: Census | None = None
        self._seq = 0
        self._start = clock()
        self._memory_rows: list[dict[str, Any]] = []
        self._notes_shown: set[str] = set()
        self._unwritable = ""  # why the report files could not be written, once they could not
        self._cuda_available: bool | None = None
        self._contexts: dict[str, int | None] = {}
        folder = path if path not in (None, "") else out_dir
        redirect = redirected_folder()
        if redirect is not None and folder is not None and Path(folder) == Path("reports"):
            # a listener (`gpu_mem_track run`) claims the default folder: write in its folder
            folder, run_name = redirect, run_name or "tracker"
        elif self.rank is not None and folder is not None and Path(folder).name != self.rank.folder_name:
            folder, run_name = self._rank_folder(Path(folder)), run_name or "tracker"
        self.run_name = run_name or default_run_name(clock())
        self.files = ReportFiles.create(folder, self.run_name) if folder is not None else None
        if self.files is not None:
            self.run_name = self.files.run_name
            versions = (
                f"torch {torch.__version__} | Python {platform.python_version()}"
                f" | gpu_mem_track {__version__}"
            )
            self.files.write_text(render_header(self.run_name, str(self._device or "auto"), versions))
            write_header(self.files.csv)
        # The files' paths as strings, made once: a track() in a destructor at interpreter
        # shutdown can make no Path (Python 3.12.3's pathlib imports while making one, and
        # every import fails once sys.meta_path is None).
        self._log_path, self._csv_path = (
            (str(self.files.log), str(self.files.csv)) if self.files else ("", "")
        )

    # -- registration -------------------------------------------------------------------------

    def watch(self, *objects: Any, **named: Any) -> MemTracker:
        """Name and classify the tensors of models, optimizers and tensors.

        Optional for models and optimizers: the census finds them wherever the program
        keeps them. Watching chooses their names, names plain tensors, and lets
        ``saved_activations`` name modules and mark a model's inputs. Positional objects
        are named from their own structure (``features.0.weight``, ``exp_avg of
        features.0.weight``); keyword objects get the keyword as prefix
        (``watch(teacher=t)`` names ``teacher.fc.weight``). Held by weak reference.
        Returns the tracker.
        """
        for prefix, obj in [("", o) for o in objects] + list(named.items()):
            self._registry.add(obj, prefix)
            if isinstance(obj, torch.nn.Module):
                self._recorder.watch(obj, prefix)
        return self

    # -- saved activations --------------------------------------------------------------------

    @contextlib.contextmanager
    def saved_activations(self) -> Iterator[SavedTensorRecorder]:
        """Record, inside the block, the tensors autograd saves for backward and the inputs
        of watched models: ``with tracker.saved_activations(): loss = model(x).sum()``.

        Recorded tensors are reported (``Activation``, ``Input``) by every stamp while they
        live, inside the block and after it: a saved activation until ``backward()`` or
        ``del`` frees its graph. Watched modules name them (``saved at train.py:42
        (encoder.layers.0.linear1)``). Yields the tracker's ``SavedTensorRecorder``.
        """
        self._recorder.install()
        try:
            yield self._recorder
        finally:
            self._recorder.uninstall()

    def close(self) -> None:
        """Stop the recording ``activations=True`` started (once; later calls do nothing)."""
        if self._recording:
            self._recording = False
            self._recorder.uninstall()

    def __enter__(self) -> MemTracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- stamping -----------------------------------------------------------------------------

    def track(self, label: object = None) -> Stamp:
        """Stamp the caller's file, line and function (and ``label``) and report changes.

        ``label`` may be any object: it is recorded as text (``options.label_text``).

        Returns the stamp (plain data). Nothing it keeps refers to a tensor.
        """
        caller = sys._getframe(1)
        try:
            return self._stamp(caller, _where(caller), label)
        finally:
            del caller

    def stamp_at(
        self,
        frame: types.FrameType | None,
        label: object = None,
        *,
        where: tuple[str, int, str] | None = None,
    ) -> Stamp:
        """Stamp as ``track()`` does, on behalf of ``frame`` instead of the caller.

        For tools that stamp for code they observe (the line runner's census after a
        line): ``frame``'s locals name tensors, and the stamp records ``where`` (file,
        line, function), by default the frame's current position. ``frame`` may be None
        when ``where`` is given (no locals are named then).
        """
        if where is None:
            if frame is None:
                raise UsageError("stamp_at needs a frame or a where=(file, line, function)")
            where = _where(frame)
        try:
            return self._stamp(frame, where, label)
        finally:
            del frame

    def region(self, label: object) -> _Region:
        """Stamp on entry and exit: ``with tracker.region("forward"): ...`` or as a decorator."""
        return _Region(self, label)

    @property
    def device(self) -> str:
        """The device being tracked, resolved now (``"cpu"``, ``"cuda:0"``, ...)."""
        chosen = self._device
        if chosen is not None and chosen.is_cuda and not self._reader_given:
            if self._cuda_available is None:
                self._cuda_available = cuda_usable()
            if not self._cuda_available:
                self._note(cuda_unavailable_note(str(chosen)))
                return "cpu"
        if chosen is not None and (chosen.type == "cpu" or chosen.index is not None):
            if chosen.index is not None and torch.cuda.is_initialized():
                count = torch.cuda.device_count()
                if chosen.index >= count:
                    raise UsageError(f"no such device: {chosen} ({count} CUDA devices visible)")
            return str(chosen)
        if torch.cuda.is_initialized():
            rank = self.rank
            index = torch.cuda.current_device() if rank is None else rank_device(torch.cuda, rank.local_rank)
            self._device = Device("cuda", index)
            return str(self._device)
        if self._cuda_available is None:
            # Asked once: is_available() starts the CUDA driver (no context) to count devices.
            self._cuda_available = chosen is not None or cuda_usable()
        index = 0 if self.rank is None else self.rank.local_rank
        return f"cuda:{index}" if self._cuda_available else "cpu"

    @property
    def last_scan(self) -> str:
        """How the last census found tensors: ``"full"`` (a heap walk), ``"young"`` (only
        objects born since the previous walk, see ``census.LiveTensorFinder``), or ``""``
        for other sources."""
        return str(getattr(self._source, "last_scan", ""))

    def live_objects(self) -> Iterator[Any]:
        """The objects the census source gives now (tensors among them), as ``track()``
        sees them: the hook ``classic.get_tensors`` reads."""
        return iter(self._source())

    def tensor_census(self) -> Census:
        """A census of the live tensors on the tracked device now (saved activations
        included while recorded), without a stamp."""
        return take_census(self.device, self._source, saved=self._recorder)

    @property
    def memory_reader(self) -> MemoryReader:
        """The allocator and driver reader of the tracked device (``readers.MemoryReader``:
        the one given to the tracker, else the real one, made once)."""
        if self._reader is None:
            self._reader = reader_for(self.device)
        return self._reader

    def baseline(self, frame: types.FrameType | None = None) -> None:
        """Take a census now and write nothing: the next stamp reports the changes since
        this moment, so what existed before (a notebook's earlier cells) is not reported
        as created. ``frame``'s locals and globals name tensors, as in ``stamp_at``."""
        try:
            self._previous = self._quiet_census(self.device, frame)
        finally:
            del frame

    def _quiet_census(self, device: str, frame: types.FrameType | None) -> Census:
        # Our temporary objects must not trigger the program's collections (nor make the
        # next census walk the heap): collect nothing until they are gone again.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._census(device, frame)
        finally:
            del frame
            if collecting:
                gc.enable()

    def _stamp(self, frame: types.FrameType | None, where: tuple[str, int, str], label: object) -> Stamp:
        device = self.device
        census = self._quiet_census(device, frame)
        frame = None
        now = self._clock()
        self._seq += 1
        stamp = Stamp(
            seq=self._seq,
            time=now,
            elapsed=now - self._start,
            file=where[0],
            line=where[1],
            function=where[2],
            label=label_text(label),
            ledger=self._ledger(device, census),
            changes=diff_census(self._previous, census),
            skipped=census.skipped,
            views=census.views,
        )
        self._previous = census
        self._emit(stamp, census)
        return stamp

    def _census(self, device: str, frame: types.FrameType | None) -> Census:
        """The census, with the roots that name tensors: watched, then bound to a name in
        ``frame`` and its callers, then found by the object source (``merge_roots``)."""
        objects = list(self._source())  # first: a finder meets new models and optimizers
        found = getattr(self._source, "roots", None)
        roots = merge_roots(self._registry.roots(), frame_roots(frame), found() if found else [])
        del frame
        if self._recorder.installed:  # saved tensors from now on name the modules running
            for prefix, obj in roots:
                if isinstance(obj, torch.nn.Module):
                    self._recorder.name(obj, prefix)
        unique = isinstance(self._source, (LiveTensorFinder, FullScan))  # else a repeat is dropped
        return take_census(
            device, lambda given=objects: given, roots, saved=self._recorder, memo=self._memo, unique=unique
        )

    def _ledger(self, device: str, census: Census) -> Ledger:
        reader = self._reader or reader_for(device)
        self._reader = reader
        allocator = reader.allocator(device)
        driver = reader.driver(device)
        context = None
        if driver is not None and driver.source == "nvml process" and self._probe is not None:
            context = self._context(device)
        return Ledger(
            device=device,
            tensors=census.nbytes,
            allocated=allocator.allocated if allocator else None,
            requested=allocator.requested if allocator else None,
            reserved=allocator.reserved if allocator else None,
            peak_allocated=allocator.peak_allocated if allocator else None,
            driver=driver.nbytes if driver else None,
            driver_source=driver.source if driver else None,
            context=context,
            rss=reader.rss(),
            categories=census.categories,
        )

    def _context(self, device: str) -> int | None:
        """The probed CUDA context cost of ``device``, asked of the probe once per device
        (the default probe only reads results already measured: no process, no context)."""
        assert self._probe is not None
        if device not in self._contexts:
            try:
                result = self._probe(device)
            except Exception as exc:  # the probe is optional: never let it break track()
                reason = str(exc) if isinstance(exc, ProbeError) else f"{type(exc).__name__}: {exc}"
                self._note(f"gpu_mem_track: no CUDA context probe ({reason}); framework cost not split")
                self._probe = None
                return None
            if result is None:
                self._note(PROBE_HINT.format(device=device))
            self._contexts[device] = None if result is None else result.context
        return self._contexts[device]

    def _emit(self, stamp: Stamp, census: Census) -> None:
        text = render_stamp(stamp, self.detail)
        if self.verbosity >= 2:
            text += render_census(census)
        if self.verbosity >= 1:
            stream = self._stream or sys.stdout
            stream.write(text)
            stream.flush()
        if self.files is None:
            self._memory_rows.extend(stamp_rows(stamp, self._rank_number))
        elif not self._unwritable:
            try:
                self._write_log(text)
                append_stamp(self._csv_path, stamp, self._rank_number)
            except OSError as exc:  # a full disk must not stop the program being measured
                self._unwritable = f"{self.files.folder}: {exc.strerror or exc}"
                print(
                    f"gpu_mem_track: cannot write reports to {self._unwritable}; this tracker's "
                    "files stop here (what was written is kept), its stamps go on",
                    file=sys.stderr,
                )
        notify(self, stamp)

    @property
    def _rank_number(self) -> int | None:
        return None if self.rank is None else self.rank.rank

    def _rank_folder(self, out_dir: Path) -> Path:
        """``<out_dir>/<launch>/rank<k>``, created: the folder this rank shares with the
        launch's other ranks (the script is ``sys.argv[0]``)."""
        assert self.rank is not None
        script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else "python"
        folder = out_dir / launch_name(script, None, self.rank) / self.rank.folder_name
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot write reports to {folder}: {exc.strerror or exc}") from exc
        return folder

    def _write_log(self, text: str) -> None:
        """Append ``text`` to the text log and close it (``ReportFiles.write_text``, from
        the path kept as a string)."""
        with open_append(self._log_path) as handle:
            handle.write(text)

    def _note(self, message: str) -> None:
        """Say ``message`` once: on the stream (stderr by default) and in the text log."""
        if message in self._notes_shown:
            return
        self._notes_shown.add(message)
        if self.verbosity >= 1:
            print(message, file=self._stream or sys.stderr)
        if self.files is not None and not self._unwritable:
            try:
                self._write_log(f"# {message}\n")
            except OSError:
                pass  # said by the next stamp's write, which fails the same way

    # -- results ------------------------------------------------------------------------------

    def to_dataframe(self) -> Any:
        """The CSV report as a pandas DataFrame (columns as in ``csvlog.COLUMNS``).

        Read back from the CSV file, so memory stays bounded however long the run;
        with ``out_dir=None`` the rows were kept in memory instead. The file is read by
        the guarded reader (``csvlog.read_frame``): one edited into something else raises
        ``errors.BadInput`` naming the file and the line.
        """
        return read_frame(self.files.csv if self.files is not None else self._memory_rows)


class _Region(contextlib.AbstractContextManager):
    """Stamps ``<label> start`` on entry and ``<label> end`` on exit, also as a decorator."""

    def __init__(self, tracker: MemTracker, label: object) -> None:
        self._tracker = tracker
        self._label = label_text(label)

    def __enter__(self) -> _Region:
        caller = sys._getframe(1)
        self._tracker._stamp(caller, _where(caller), f"{self._label} start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        caller = sys._getframe(1)
        self._tracker._stamp(caller, _where(caller), f"{self._label} end")

    def __call__(self, func: F) -> F:
        code = func.__code__
        where = (code.co_filename, code.co_firstlineno, func.__qualname__)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._tracker._stamp(sys._getframe(0), where, f"{self._label} start")
            try:
                return func(*args, **kwargs)
            finally:
                self._tracker._stamp(sys._getframe(0), where, f"{self._label} end")

        return wrapper  # type: ignore[return-value]


def _where(frame: types.FrameType) -> tuple[str, int, str]:
    """(file, line, function) of a frame, as a stamp records them."""
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
