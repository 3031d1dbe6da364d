"""Measuring for the notebook magics: one statement (``measure_statement``) or one cell
under the runner's line engine (``profile_cell``), run in the user's namespace.

Peaks follow the runner (``runner.samplers``): the high-water mark (the CUDA allocator's
allocated peak, or the process's ``ru_maxrss``) is never reset, so the user's own
counters stay as they were; when the mark rose while the code ran it is the code's exact
peak, otherwise the peak is at least the larger of the readings before and after.
"""

from __future__ import annotations

import itertools
import linecache
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import CodeType, SimpleNamespace
from typing import Any

from ..runner.profiler import LineProfiler
from ..runner.samplers import CudaSampler, RssSampler, Sampler
from ..runner.session import RunSession
from ..runner.tracer import best_engine
from ..tracker.listeners import add_stamp_listener, remove_stamp_listener
from ..tracker.records import Census, diff_census
from .records import CellProfile, StatementMemory

__all__ = ["CellOptions", "cell_filename", "default_device", "measure_statement", "profile_cell", "rise"]

_cells = itertools.count(1)


@dataclass(frozen=True)
class CellOptions:
    """``%%memtrack``'s options, as ``run``'s: ``census_threshold`` in bytes (None: no
    automatic census), ``activations`` (record tensors saved for backward), ``top``
    (lines in the summary), ``device`` (``cpu``, ``cuda:N``; None: ``default_device``),
    ``simulate``: the ``simgpu.GpuSpec`` to run the cell on (None: the real device)."""

    census_threshold: int | None = None
    activations: bool = False
    top: int = 5
    device: str | None = None
    simulate: Any = None


def default_device() -> str:
    """``cuda:N`` (the current device) once the program has started CUDA, else ``cpu``:
    the magics never start CUDA themselves."""
    import torch

    if torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def rise(before: int, high_before: int, after: int, high_after: int) -> tuple[int, bool]:
    """The peak between two readings of (current, high-water mark) and whether it is
    exact (the mark rose) or a lower bound (the larger current reading)."""
    if high_after > high_before:
        return max(high_after, before, after), True
    return max(before, after), False


def measure_statement(
    code: CodeType | str,
    namespace: dict[str, Any],
    device: str,
    *,
    text: str = "",
    source: Callable[[], list[Any]] | None = None,
    sampler: Sampler | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StatementMemory:
    """Run ``code`` in ``namespace`` and measure it on ``device``: a census before and after
    (``source`` gives the census's candidate objects, default ``census.full_scan``; the
    namespace's tensors, modules and optimizers name them), the memory figure of
    ``StatementMemory.source`` and the peak from ``sampler`` (default: the CUDA allocator
    on a GPU, the process RSS on the CPU). An exception from ``code`` propagates."""
    from ..tracker.census import full_scan

    __tracebackhide__ = True  # IPython shows the user's frames of an exception, not ours
    source = source or full_scan
    on_cuda = device.startswith("cuda")
    rss = RssSampler()
    sampler = sampler or (CudaSampler(device) if on_cuda else rss)
    try:
        census_before = _census(device, namespace, source)
        rss_before = rss.sample()[0]
        before, high_before = sampler.sample()
        start = clock()
        exec(code, namespace)
        seconds = clock() - start
        after, high_after = sampler.sample()
        rss_after = rss.sample()[0]
        census_after = _census(device, namespace, source)
    finally:
        rss.close()
    peak, exact = rise(before, high_before, after, high_after)
    figure = (before, after) if on_cuda else (census_before.nbytes, census_after.nbytes)
    return StatementMemory(
        statement=text or (code if isinstance(code, str) else code.co_filename),
        device=device,
        source="cuda allocator" if on_cuda else "tensors",
        before=figure[0],
        after=figure[1],
        peak_source=sampler.source,
        peak_before=before,
        peak=peak,
        peak_exact=exact,
        tensors_before=census_before.nbytes,
        tensors_after=census_after.nbytes,
        rss_before=rss_before,
        rss_after=rss_after,
        changes=diff_census(census_before, census_after),
        seconds=seconds,
    )


def cell_filename() -> str:
    """A new pseudo-file name for a cell, ``<memtrack-cell-N>``."""
    return f"<memtrack-cell-{next(_cells)}>"


def profile_cell(
    cell: str,
    namespace: dict[str, Any],
    options: CellOptions,
    *,
    filename: str | None = None,
    sampler: Sampler | None = None,
    engine: str = "auto",
) -> CellProfile:
    """Run ``cell`` in ``namespace`` under the runner's line engine, its code compiled as
    ``filename`` (registered with ``linecache`` so the records hold the code text), and
    return its per-line records and automatic censuses. A ``SyntaxError`` or an exception
    from the cell propagates (the engine and hooks are removed first). With
    ``options.simulate`` the cell runs on that simulated GPU (``simgpu.simulated_gpu``),
    entered for the cell only: what it records goes into ``CellProfile.simulation``."""
    from ..runner.simulate import simulation, simulation_info

    __tracebackhide__ = True  # IPython shows the user's frames of an exception, not ours
    with simulation(options.simulate) as gpu:
        profile = _profile_cell(cell, namespace, options, filename, sampler, engine)
    if gpu is not None:
        profile = replace(profile, simulation=simulation_info(gpu))
    return profile


def _profile_cell(
    cell: str,
    namespace: dict[str, Any],
    options: CellOptions,
    filename: str | None,
    sampler: Sampler | None,
    engine: str,
) -> CellProfile:
    __tracebackhide__ = True  # see profile_cell
    filename = filename or cell_filename()
    linecache.cache[filename] = (len(cell), None, cell.splitlines(keepends=True), filename)
    code = compile(cell, filename, "exec")
    device = options.device or default_device()
    sampler = sampler or (CudaSampler(device) if device.startswith("cuda") else RssSampler())
    session = RunSession(None, device, None)  # type: ignore[arg-type]  # no folder: no files
    profiler = LineProfiler(sampler, None, session.census, options.census_threshold)
    session.profiler = profiler
    tracer = best_engine(profiler, lambda c: c.co_filename == filename, engine)
    start = time.perf_counter()
    add_stamp_listener(session)
    try:
        if options.activations or options.census_threshold is not None:
            # what earlier cells left is the baseline, not the cell's own creation
            session.census_tracker(activations=options.activations).baseline(_namespace_frame(namespace))
        tracer.start()
        try:
            exec(code, namespace)
        finally:
            tracer.stop()
    finally:
        remove_stamp_listener(session)
        session.close()
        profiler.finish()
        sampler.close()
    peak_line = profiler.peak_at[1] if profiler.peak_at else None
    return CellProfile(
        filename=filename,
        device=device,
        source=sampler.source,
        lines=tuple(profiler.records()),
        censuses=tuple(session.censuses),
        peak=profiler.peak,
        peak_line=peak_line,
        census_threshold=options.census_threshold,
        top=options.top,
        seconds=time.perf_counter() - start,
    )


def _census(device: str, namespace: dict[str, Any], source: Callable[[], list[Any]]) -> Census:
    from ..tracker.census import take_census
    from ..tracker.naming import frame_roots

    roots = frame_roots(_namespace_frame(namespace))
    try:
        return take_census(device, source, roots)
    finally:
        del roots


def _namespace_frame(namespace: dict[str, Any]) -> Any:
    """A stand-in frame whose globals and locals are the notebook's namespace (the census
    names tensors from a frame's variables)."""
    return SimpleNamespace(f_globals=namespace, f_locals=namespace, f_back=None)
