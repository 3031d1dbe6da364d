"""Running the user's script as ``python script.py`` would, and ending it as it ends.

``run_script`` sets ``sys.argv`` (the script path as typed, the arguments verbatim) and
``sys.path[0]``, runs the script as ``__main__`` under the tracing engine, and turns how it
ended into an exit code: 0, its ``sys.exit`` code, 1 after an uncaught exception (its
traceback printed without our frames), 0 when the runner stopped it early
(``steady.StopRun``), 130 after Ctrl-C (its traceback too, as python prints it), 128 + N
after SIGTERM or SIGHUP (which unwind the script like Ctrl-C, so the reports still get
written). It restores ``sys.argv``, ``sys.path[0]``, the working folder (unless the script
removed it) and the signal handlers afterwards. A forked child (a DataLoader worker) stops
tracing and gets the default handlers back.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import os
import runpy
import signal
import sys
import threading
import traceback
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..tracker.listeners import add_stamp_listener, remove_stamp_listener
from .steady import StopRun

if TYPE_CHECKING:
    from .options import PreparedRun
    from .session import RunSession

__all__ = ["dies_of_signals_after_unwinding", "run_script", "runner_objects_frozen"]

#: Frames of these files are left out of the script's traceback.
_OUR_FILES = (os.path.abspath(__file__),)
#: Frames from here on are the simulated GPU's machinery (``run --simulate``): left out of
#: the script's traceback, as a real GPU's error shows none of CUDA's internals.
_SIMULATION_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "simgpu") + os.sep
#: This package's folder: its frames at the end of a traceback are the line tracer's.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def run_script(prepared: PreparedRun, engine: Any, session: Any, pad: bool = False) -> int:
    """Run the prepared script as ``__main__`` under ``engine`` and return its exit code
    (see the module docstring); ``session`` is the run's stamp listener
    (``session.RunSession``), registered while the script runs, with its ``timeline``;
    ``pad``: compile the script with ``loops.pad_loops`` (a stop rule that leaves loops).
    Everything it changes is restored before it returns."""
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    saved_cwd = os.getcwd()
    # argv[0] as the user typed it, the rest verbatim: what ``python script ...`` gives.
    sys.argv[:] = [prepared.options.script, *prepared.options.args]
    # python puts the script's folder first on sys.path (a folder or zip run: itself)
    first = prepared.script if _runs_through_runpy(prepared.script) else prepared.script.parent
    if sys.path:
        sys.path[0] = str(first)
    else:
        sys.path.append(str(first))
    add_stamp_listener(session)
    _Forks.watch(engine, session)
    handlers = _Terminated.install()
    try:
        try:
            engine.start()
        except RuntimeError as exc:  # no free sys.monitoring tool slot: not the script's error
            print(f"gpu_mem_track: cannot trace: {exc}", file=sys.stderr)
            return 2
        try:
            _run_main(prepared.script, prepared.options.script, session.script_globals, pad)
        finally:
            engine.stop()
        return 0
    except SystemExit as exc:
        return _exit_code(exc.code)
    except StopRun:  # the runner stopped it (steady memory, a budget): the reports say why
        return 0
    except KeyboardInterrupt as exc:  # the traceback python prints, then 130 as the shell says
        _print_exception(exc)
        return 130
    except _Terminated as exc:
        print(
            f"gpu_mem_track: {signal.Signals(exc.signum).name} received, writing the reports", file=sys.stderr
        )
        return 128 + exc.signum
    except BaseException as exc:  # the script's own error: its traceback, then exit 1
        _print_exception(exc)
        return 1
    finally:
        _Terminated.restore(handlers)
        _Forks.watch(None, None)
        remove_stamp_listener(session)
        sys.argv[:] = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
        try:
            os.chdir(saved_cwd)
        except OSError:  # the script removed it: our paths are absolute, stay where it left us
            pass


@contextlib.contextmanager
def runner_objects_frozen() -> Iterator[bool]:
    """Keep the objects alive now (the runner's modules, its parser, its options: 12,000
    more than a bare python holds) out of the script's garbage collections while the block
    runs: ``gc.freeze()`` before, ``gc.unfreeze()`` after; yields whether it froze.

    Python collects its oldest generation when the objects that entered it since the last
    full collection outnumber a quarter of those in it, and such a collection visits every
    object there: unfrozen, the runner's objects shift when the script's full collections
    happen (in the runner's CPU benchmark, one more than under plain python, 0.14 s of
    4.5: reports/bench_runner_native_py312.md). Frozen, the script's collections count and
    visit what they would under plain python. Only where torch is not imported yet:
    frozen objects are out of ``gc.get_objects()`` and ``gc.get_referrers()``, which a
    census walks for tensors, modules and optimizers (the runner's own objects are none of
    these). The unfreeze also releases what was frozen before (Python 3.12 starts with 375
    of its own tuples frozen) into the oldest generation, as any ``gc.unfreeze()`` does. A
    forked child (a DataLoader worker) keeps them frozen."""
    froze = "torch" not in sys.modules
    if froze:
        gc.freeze()
    try:
        yield froze
    finally:
        if froze:
            gc.unfreeze()


def _print_exception(exc: BaseException) -> None:
    """The script's exception as python prints it (our frames left out), on stderr if the
    script left one to print on."""
    try:
        tb = _user_traceback(exc.__traceback__, isinstance(exc, KeyboardInterrupt))
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    except (OSError, ValueError, AttributeError):  # stderr closed or set to None
        pass


def _run_main(script: Path, typed: str, keep: list[Any], pad: bool = False) -> None:
    """Run ``script`` as ``__main__`` as ``python script`` does: ``__file__`` absolute,
    ``sys.argv`` left as set (``runpy.run_path`` would replace ``argv[0]`` with the path
    it was given). A zip application or a folder goes through ``runpy`` (its
    ``__main__.py``), as python does, by the path as ``typed``. A ``SyntaxError`` names
    the file (compiling bytes with a NUL names none). The script's globals are appended to
    ``keep``: python keeps them until it exits, so the memory at the end counts them."""
    if _runs_through_runpy(script):
        argv0 = sys.argv[0]
        try:
            keep.append(runpy.run_path(typed, run_name="__main__"))
        finally:
            sys.argv[0] = argv0
        return
    with io.open_code(str(script)) as handle:
        source = handle.read()
    try:
        code = _compile(source, str(script), pad)
    except (SyntaxError, ValueError) as exc:
        if isinstance(exc, SyntaxError) and exc.filename:
            raise
        nul = source.find(b"\0")
        line = source.count(b"\n", 0, nul) + 1 if nul >= 0 else None
        why = "source code cannot contain null bytes" if nul >= 0 else str(exc)
        raise SyntaxError(why, (str(script), line, None, None)) from None
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=str(script), __cached__=None, __loader__=None, __package__=None)
    keep.append(main)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickle and friends find the script's classes here
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _compile(source: bytes, filename: str, pad: bool) -> types.CodeType:
    """The script's code; with ``pad``, with a line to land on after each loop that ends
    a function or block (``loops.pad_loops``)."""
    if not pad:
        return compile(source, filename, "exec", dont_inherit=True)
    from .loops import pad_loops

    return compile(pad_loops(ast.parse(source, filename)), filename, "exec", dont_inherit=True)


def _runs_through_runpy(script: Path) -> bool:
    return script.is_dir() or zipfile.is_zipfile(script)


@contextlib.contextmanager
def dies_of_signals_after_unwinding() -> Iterator[None]:
    """Around the runner's set-up and its reports (``run_script`` then sees our handler
    and keeps it): SIGTERM and SIGHUP at their default raise ``_Terminated``, so the
    ``except`` and ``finally`` clauses inside run (the runner removes a run folder the
    script never wrote into); then the process dies of the signal, as it would have at
    once (exit 128 + N)."""
    handlers = _Terminated.install()
    try:
        yield
    except _Terminated as exc:
        _Terminated.restore(handlers)  # the signal's default again: dying of it
        handlers = {}
        sys.stderr.flush()
        os.kill(os.getpid(), exc.signum)
        raise  # only when the signal was not fatal after all
    finally:
        _Terminated.restore(handlers)


class _Terminated(BaseException):
    """SIGTERM or SIGHUP while the script runs: unwinds it like Ctrl-C, so the reports are
    written, and the run exits with 128 + the signal's number (the shell's convention)."""

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @classmethod
    def install(cls) -> dict[int, Any]:
        """Our handler for each signal still at its default (an ignored SIGHUP, as under
        ``nohup``, stays ignored); returns the handlers replaced."""
        replaced: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return replaced  # only the main thread may set handlers
        for signum in cls.SIGNALS:
            if signal.getsignal(signum) is signal.SIG_DFL:
                replaced[signum] = signal.signal(signum, cls._raise)
        return replaced

    @staticmethod
    def restore(replaced: dict[int, Any]) -> None:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)

    @classmethod
    def default_in_child(cls) -> None:
        """A forked child (a DataLoader worker) dies of SIGTERM as it would without us."""
        for signum in cls.SIGNALS:
            if signal.getsignal(signum) is cls._raise:
                signal.signal(signum, signal.SIG_DFL)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise _Terminated(signum)


class _Forks:
    """A forked child (a DataLoader worker) stops tracing, never writes our timeline and
    gets the default SIGTERM and SIGHUP back."""

    engine: Any = None
    session: RunSession | None = None
    registered = False

    @classmethod
    def watch(cls, engine: Any, session: RunSession | None) -> None:
        cls.engine, cls.session = engine, session
        if not cls.registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=cls._in_child)
            cls.registered = True

    @classmethod
    def _in_child(cls) -> None:
        if cls.session is not None:
            cls.session.timeline.discard()
            remove_stamp_listener(cls.session)
        if cls.engine is not None:
            cls.engine.stop()
        cls.engine = cls.session = None
        _Terminated.default_in_child()


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)  # sys.exit("message"), as Python itself does
    except (OSError, ValueError, AttributeError):
        pass
    return 1


def _user_traceback(tb: TracebackType | None, interrupted: bool = False) -> TracebackType | None:
    """The traceback from the script's first frame on: ours and runpy's left out, and
    cut where the simulated GPU's frames begin (``run --simulate``) or, when
    ``interrupted`` (a Ctrl-C may land while the line tracer runs), where this package's
    frames begin."""
    runpy_file = os.path.abspath(runpy.__file__)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen runpy") or os.path.abspath(name) in (runpy_file, *_OUR_FILES)):
            break
        tb = tb.tb_next
    last, entry = None, tb
    while entry is not None:  # the script's frames end where the simulated GPU's (or ours) begin
        name = entry.tb_frame.f_code.co_filename
        if last is not None and (
            name.startswith(_SIMULATION_DIR) or (interrupted and name.startswith(_PACKAGE))
        ):
            last.tb_next = None
            break
        last, entry = entry, entry.tb_next
    return tb
