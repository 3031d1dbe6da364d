"""What the trainer callbacks share: one training run's tracker, its folder and its stamps.

A ``TrainingSession`` is driven by a framework's callback (``hf``, ``lightning``) and
knows nothing of the framework. At train start it claims the run folder, makes a
``MemTracker`` writing ``tracker.log``/``tracker.csv`` there, watches the model and the
optimizers (so the census names parameters and optimizer state without a ``watch()``
call of the user's) and stamps ``train start``. During the first optimizer step it stamps
``step 1 forward`` (recording, for that forward only, the tensors autograd saves for
backward, so they show as ``Activation``), ``step 1 backward`` and ``step 1 optimizer
step``; then ``step N`` every ``every`` optimizer steps, and ``train end``.

Rank-aware (``gpu_mem_track.ranks``): under ``torchrun`` each rank writes to
``<out_dir>/<launch>/rank<k>/`` and only rank 0 prints; in one process the folder is
``<out_dir>/<run>/``. Under ``gpu_mem_track run`` with the default ``out_dir`` the
stamps go into the runner's folder instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import time
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..outputs import claim_folder, default_run_name, safe_name
from ..ranks import rank_folder, rank_info
from ..tracker.listeners import listening, redirected_folder
from .progress import BesideProgressBars

__all__ = [
    "FILE_NAME",
    "LABELS",
    "SessionCallback",
    "TrainingSession",
    "missing_extra",
    "package_dirs",
    "user_frame",
]

#: The labels of the stamps a session writes, in order (``step N`` stands for the
#: periodic ones, ``step 2``, ``step 100``, ...).
LABELS = ("train start", "step 1 forward", "step 1 backward", "step 1 optimizer step", "step N", "train end")

#: Base name of the report files in the run folder (as the line runner names its
#: trackers' files, so ``compare``/``plot`` take ``<folder>/tracker.csv``).
FILE_NAME = "tracker"

#: Options that belong to the session, not passed on to ``MemTracker``.
_OWN = ("out_dir", "run_name", "device", "verbosity", "activations", "frame", "path", "verbose")


def missing_extra(
    error: ModuleNotFoundError, packages: Iterable[str], extra: str, module: str
) -> ImportError | None:
    """The ``ImportError`` the integration ``module`` raises when its framework is not
    installed, naming the extra to install; None when the missing module is not one of
    ``packages`` (a broken install rather than a missing one: re-raise ``error`` then)."""
    names = tuple(packages)
    if (error.name or "").split(".")[0] not in names:
        return None
    return ImportError(
        f'{module} needs {" or ".join(names)}, which is not installed: pip install "gpu_mem_track[{extra}]"'
    )


def user_frame(skip: Iterable[str]) -> types.FrameType | None:
    """The innermost calling frame whose file is outside the folders ``skip``, the
    standard library and gpu_mem_track: the user's code that started training (None
    when there is none). The caller must ``del`` the frame when done."""
    skipped = tuple(_folder(d) for d in skip) + (_folder(os.path.dirname(os.path.dirname(__file__))),)
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not (path.startswith(skipped) or _in_stdlib(path)):
            break
        frame = frame.f_back
    return frame


def _folder(path: str) -> str:
    return os.path.join(os.path.abspath(path), "")


_PATHS = sysconfig.get_paths()
_STDLIB = tuple({_folder(_PATHS["stdlib"]), _folder(_PATHS["platstdlib"])})
_SITE = tuple({_folder(_PATHS["purelib"]), _folder(_PATHS["platlib"])})


def _in_stdlib(path: str) -> bool:
    """Whether ``path`` is a standard-library file (site-packages may lie inside the
    standard library's folder: it does not count)."""
    return path.startswith(_STDLIB) and not path.startswith(_SITE)


def package_dirs(*names: str) -> tuple[str, ...]:
    """The folders of the installed packages ``names`` (``torch``, ``transformers``), whose
    frames are the framework's, not the user's; found without importing them."""
    found = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        found.extend(spec.submodule_search_locations or () if spec is not None else ())
    return tuple(found)


class TrainingSession:
    """One training run's stamps, driven by a framework callback (see the module docstring).

    Args:
        every: stamp ``step N`` after every ``every``-th optimizer step from step 2 on
            (the first step has its own three stamps); 0 stamps only the first step.
        out_dir: where run folders are made (``<out_dir>/<run>/``, or under ``torchrun``
            ``<out_dir>/<launch>/rank<k>/``); None writes no files.
        run_name: the run (or launch) folder's name; default ``<script>-<date>-<time>``
            in one process, see ``gpu_mem_track.ranks`` under ``torchrun``. A name an
            earlier run took gets ``-2``, ``-3``, ...
        device: the device to track; default the device of the model's first parameter.
        verbosity: as ``MemTracker``'s; default 1 (print each stamp) in one process and on
            rank 0, 0 (files only) on the other ranks.
        activations: record, during the first step's forward only, the tensors autograd
            saves for backward (``Activation`` groups in ``step 1 forward``).
        skip: folders whose frames are the framework's: a stamp records the first calling
            frame outside them (the user's ``trainer.train()`` / ``fit()`` line).
        **tracker_options: passed to ``MemTracker`` (``census``, ``probe``, ``detail``,
            ``stream``, ``reader``, ``source``, ``clock``); ``stream`` (default stdout)
            is written beside ``tqdm`` progress bars, each stamp on a fresh line.

    After train start, ``tracker`` is the ``MemTracker`` and ``folder`` the run folder
    (None without files).
    """

    def __init__(
        self,
        every: int = 100,
        *,
        out_dir: str | Path | None = "reports",
        run_name: str | None = None,
        device: Any = None,
        verbosity: int | None = None,
        activations: bool = True,
        skip: Iterable[str] = (),
        **tracker_options: Any,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise UsageError(f"every must be a whole number of steps >= 0 (0: step 1 only), not {every!r}")
        _check_tracker_options(tracker_options)
        self.every = every
        self.out_dir = out_dir
        self.run_name = run_name
        self.device = device
        self.verbosity = verbosity
        self.activations = activations
        self.tracker: Any = None
        self.folder: Path | None = None
        self._skip = tuple(skip)
        # Stamps start on a fresh line even while a tqdm bar is drawn (``progress``).
        stream = tracker_options.get("stream")
        self._options = {**tracker_options, "stream": BesideProgressBars(stream)}
        self._pending: list[str] = []
        self._last_step = 0
        self._recording: contextlib.ExitStack | None = None

    # -- the framework's events ---------------------------------------------------------------

    def start(self, model: Any, optimizers: Iterable[Any] = ()) -> None:
        """Train start: claim the folder, make the tracker, watch ``model`` and
        ``optimizers`` (wrappers with an ``optimizer``/``_optimizer`` attribute are
        unwrapped), stamp ``train start``."""
        from ..tracker.memtracker import MemTracker

        self.stop_recording()
        info = rank_info()
        self.folder = self._claim_folder(info)
        verbosity = self.verbosity if self.verbosity is not None else int(info is None or info.is_first)
        # The folder is claimed already: hand it over as the runner does (a listener naming
        # it, the default out_dir), so a rank-aware MemTracker does not nest another
        # launch folder inside it.
        claim = listening(_FolderClaim(self.folder)) if self.folder is not None else contextlib.nullcontext()
        with claim:
            self.tracker = MemTracker(
                device=self.device if self.device is not None else _device_of(model),
                out_dir="reports" if self.folder is not None else None,
                run_name=FILE_NAME,
                verbosity=verbosity,
                **self._options,
            )
        self.tracker.watch(model)
        for optimizer in optimizers:
            inner = _unwrap(optimizer)
            if inner is not None:
                self.tracker.watch(inner)
        self._pending = list(LABELS[1:4])
        self._last_step = 0
        self.stamp(LABELS[0])

    @property
    def first_forward_due(self) -> bool:
        """Whether the first step's forward has not been stamped yet (train has started)."""
        return bool(self._pending) and self._pending[0] == LABELS[1]

    def first_forward_begins(self) -> None:
        """The first step's forward is about to run: record what it saves for backward."""
        if self.first_forward_due and self.activations and self._recording is None:
            self._recording = contextlib.ExitStack()
            self._recording.enter_context(self.tracker.saved_activations())

    def first_step_event(self, label: str) -> None:
        """``label`` (``step 1 forward``, ``step 1 backward`` or ``step 1 optimizer
        step``) happened: stamp it if it is still due in this first step (a stamp whose
        event never came is passed over). Stops recording activations."""
        self.stop_recording()
        if label in self._pending:
            del self._pending[: self._pending.index(label) + 1]
            self.stamp(label)

    def step_end(self, step: int) -> None:
        """Optimizer step ``step`` (counted from 1) is done: stamp ``step <step>`` when due."""
        self.stop_recording()
        if step < 1 or step == self._last_step:  # accumulating, or another batch of the step
            return
        self._last_step = step
        self._pending.clear()
        if self.tracker is not None and self.every and step > 1 and step % self.every == 0:
            self.stamp(f"step {step}")

    def end(self) -> None:
        """Train end: stamp ``train end``."""
        self.stop_recording()
        if self.tracker is not None:
            self.stamp(LABELS[-1])
            self.tracker.close()

    def stop_recording(self) -> None:
        """Stop recording saved activations, if recording (safe to call at any time)."""
        if self._recording is not None:
            recording, self._recording = self._recording, None
            recording.close()

    # -- helpers ------------------------------------------------------------------------------

    def stamp(self, label: str) -> None:
        """Stamp ``label`` on behalf of the user's frame that runs the training."""
        frame = user_frame(self._skip)
        try:
            if frame is None:
                self.tracker.stamp_at(None, label, where=("<training>", 0, "train"))
            else:
                self.tracker.stamp_at(frame, label)
        finally:
            del frame

    def _claim_folder(self, info: Any) -> Path | None:
        if self.out_dir is None:
            return None
        redirect = redirected_folder()
        if redirect is not None and Path(self.out_dir) == Path("reports"):
            return redirect  # inside `gpu_mem_track run`: the run's own folder
        script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else "python"
        if info is not None:
            return rank_folder(self.out_dir, self.run_name, script, info)
        name = safe_name(self.run_name or default_run_name(time.time()))
        return claim_folder(Path(self.out_dir), name)


class SessionCallback:
    """What every framework callback exposes of its ``session`` (a
    :class:`TrainingSession`): ``tracker`` (the ``MemTracker``) and ``folder`` (the run
    folder), both set at train start."""

    session: TrainingSession

    @property
    def tracker(self) -> Any:
        return self.session.tracker

    @property
    def folder(self) -> Any:
        return self.session.folder


class _FolderClaim:
    """A stamp listener that only names a folder: trackers made while it listens with the
    default output folder write there (``tracker.listeners``)."""

    def __init__(self, folder: Path) -> None:
        self.folder: Path | None = folder

    def on_stamp(self, tracker: Any, stamp: Any) -> None:
        """Stamps are not this listener's business."""


def _check_tracker_options(options: dict[str, Any]) -> None:
    from ..tracker.memtracker import MemTracker

    allowed = [name for name in inspect.signature(MemTracker).parameters if name not in _OWN]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r} (MemTracker options here: {', '.join(allowed)})")


def _device_of(model: Any) -> Any:
    """The device of the model's first parameter (None: no parameters, let MemTracker pick)."""
    try:
        return next(iter(model.parameters())).device
    except (StopIteration, AttributeError, TypeError):
        return None


def _unwrap(optimizer: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside framework wrappers (accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``), or None."""
    import torch

    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
