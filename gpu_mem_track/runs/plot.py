"""Memory over time, like ``mprof plot``: one or more runs on one chart, written as an
image file.

Per run, in one color: the run's memory (solid; the allocator's allocated bytes on CUDA,
the process RSS or the census's tensor bytes elsewhere, as the legend says), the
allocator's reserved bytes (dashed) and the driver's figure (dotted) where recorded, and
for a MemTracker CSV on the CPU the process RSS (dash-dot); the peak marked with a
triangle and its value; ``track()`` stamps as thin vertical lines (at most ``MAX_LABELS``
per run, see ``pick_labels``), each label's text written once. x: seconds since the run started;
y: MiB, or GiB when a curve reaches 1 GiB.

Needs matplotlib (``pip install "gpu_mem_track[plot]"``); without it ``PlotUnavailable``
is raised. The chart is drawn on a ``matplotlib.figure.Figure`` rendered by the Agg
backend directly, so ``pyplot`` and the user's backend choice are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..units import format_bytes
from .load import DEFAULT_POINTS, LabelPoint, Run, Sample, load_run

__all__ = ["MAX_LABELS", "PlotUnavailable", "pick_labels", "plot_files", "timeline_figure", "write_plot"]

#: At most this many ``track()`` labels are annotated per run (evenly picked).
MAX_LABELS = 20

_GIB = 2**30
_EXTRAS = (("reserved", "reserved", "--"), ("driver", "driver", ":"), ("rss", "RSS", "-."))
_MAIN_NAMES = {"cuda allocator": "allocated", "process RSS": "RSS", "tensors": "tensors"}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def plot_files(
    paths: Sequence[str | Path], output: str | Path, title: str | None = None, points: int = DEFAULT_POINTS
) -> Path:
    """Load each run (see ``runs``; a launch folder stands for its ranks), draw them on
    one chart and write it to ``output`` (format from its suffix: png, svg, pdf...).
    Returns ``output``. ``UsageError`` for a path that cannot be loaded or has no
    timeline, or an output that cannot be written; ``PlotUnavailable`` without
    matplotlib (checked before loading)."""
    from .ranks import expand_launches

    _matplotlib()
    runs = [load_run(path, lines=False, points=points) for path in expand_launches(paths)]
    for run in runs:
        if not run.samples:
            raise UsageError(f"{run.path} has no memory over time to plot ({_why_empty(run)})")
    output = Path(output)
    write_plot(runs, output, title)
    return output


def write_plot(runs: Sequence[Run], output: Path | Any, title: str | None = None, dpi: int = 110) -> None:
    """Draw ``runs`` (``timeline_figure``) and save the image to ``output``, a path or
    a binary stream (PNG for a stream). ``UsageError`` if it cannot be written."""
    figure = timeline_figure(runs, title)
    options: dict[str, Any] = {"dpi": dpi}
    if not isinstance(output, Path):
        options["format"] = "png"
    try:
        figure.savefig(output, **options)
    except ValueError as exc:  # an image format matplotlib does not know
        raise UsageError(f"cannot write {output}: {exc}") from exc
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from exc


def timeline_figure(runs: Sequence[Run], title: str | None = None) -> Any:
    """A ``matplotlib.figure.Figure`` of the runs' memory over time (see the module
    docstring); runs without samples are skipped."""
    figure_class = _matplotlib()
    figure = figure_class(figsize=(11, 5.8))
    axes = figure.add_subplot()
    drawn = [run for run in runs if run.samples]
    scale, unit = _unit(drawn)
    span = max((s.elapsed for run in drawn for s in run.samples or ()), default=0.0)
    written: list[tuple[str, float]] = []  # labels already written, to write each once across runs
    for index, run in enumerate(drawn):
        color = f"C{index % 10}"
        _draw_curves(axes, run, color, scale)
        _mark_peak(axes, run, color, scale, index)
        _mark_labels(axes, run, color, written, tolerance=span / 100)
    axes.set_xlabel("seconds since the start")
    axes.set_ylabel(f"memory ({unit})")
    axes.set_title(
        title if title is not None else " vs ".join(run.name for run in drawn) or "memory over time"
    )
    axes.set_ylim(bottom=0, top=max(axes.get_ylim()[1], 1e-9) * 1.12)  # room for the labels' text
    axes.set_xlim(left=0)
    axes.grid(alpha=0.3)
    if drawn:
        # Outside the axes, on the right: inside it would hide the labels or the curves.
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    figure.tight_layout()
    return figure


def _matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable('plotting needs matplotlib: pip install "gpu_mem_track[plot]"') from exc
    return Figure


def _why_empty(run: Run) -> str:
    if run.path.name == "lines.csv":
        return "lines.csv holds per-line totals; plot the run folder or its timeline.csv"
    if run.kind == "tracker":
        return "no track() stamps yet"
    return "no timeline.csv or no rows with memory in it"


def _unit(runs: Sequence[Run]) -> tuple[float, str]:
    highest = 0
    for run in runs:
        for sample in run.samples or ():
            values = [sample.memory] + [getattr(sample, name) for name, _, _ in _EXTRAS if _shows(run, name)]
            highest = max([highest] + [v for v in values if v is not None])
    return (_GIB, "GiB") if highest >= _GIB else (2**20, "MiB")


def _shows(run: Run, field: str) -> bool:
    # RSS is host memory: drawn only beside a CPU run's tensor bytes, never beside GPU memory
    # (and not twice when it is the run's memory already).
    return field != "rss" or run.memory_source == "tensors"


def _draw_curves(axes: Any, run: Run, color: str, scale: float) -> None:
    samples = run.samples or ()
    style = {"marker": ".", "markersize": 5} if len(samples) <= 60 else {}
    main = _MAIN_NAMES.get(run.memory_source, run.memory_source or "memory")
    axes.plot(
        [s.elapsed for s in samples],
        [s.memory / scale for s in samples],
        color=color,
        linewidth=1.6,
        label=f"{run.name}: {main}",
        **style,
    )
    for field, name, dashes in _EXTRAS:
        known = [s for s in samples if getattr(s, field) is not None]
        if not known or not _shows(run, field):
            continue
        axes.plot(
            [s.elapsed for s in known],
            [getattr(s, field) / scale for s in known],
            color=color,
            linestyle=dashes,
            linewidth=1.1,
            alpha=0.75,
            label=f"{run.name}: {name}",
        )


def _mark_peak(axes: Any, run: Run, color: str, scale: float, index: int) -> None:
    top = _highest(run.samples or ())
    if top is None:
        return
    axes.plot([top.elapsed], [top.memory / scale], marker="^", markersize=9, color=color, zorder=5)
    axes.annotate(
        f"peak {format_bytes(top.memory)}",
        (top.elapsed, top.memory / scale),
        xytext=(7, -4 - 12 * index),
        textcoords="offset points",
        fontsize=8,
        color=color,
        fontweight="bold",
        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
        zorder=6,
    )


def _highest(samples: Sequence[Sample]) -> Sample | None:
    best = None
    for sample in samples:
        if best is None or sample.memory > best.memory:
            best = sample
    return best


def _mark_labels(axes: Any, run: Run, color: str, written: list[tuple[str, float]], tolerance: float) -> None:
    from matplotlib.transforms import blended_transform_factory

    where = blended_transform_factory(axes.transData, axes.transAxes)
    named: set[str] = set()
    for point in pick_labels(run.labels or ()):
        axes.axvline(point.elapsed, color=color, linewidth=0.8, linestyle=(0, (2, 3)), alpha=0.45)
        if point.label in named:
            continue  # a repeat ("step" in a loop): its line, without the text again
        named.add(point.label)
        if any(text == point.label and abs(x - point.elapsed) <= tolerance for text, x in written):
            continue  # another run has the same label here: one text is enough
        written.append((point.label, point.elapsed))
        axes.text(
            point.elapsed,
            0.985,
            f" {point.label}",
            transform=where,
            rotation=90,
            va="top",
            ha="left",
            fontsize=7,
            color=color,
            clip_on=True,
        )


def pick_labels(labels: Sequence[LabelPoint], limit: int = MAX_LABELS) -> list[LabelPoint]:
    """The labelled stamps worth marking, at most ``limit``, in time order: the first stamp
    of each distinct non-empty label (evenly thinned if there are more than ``limit``),
    then, in the slots left, repeats of a label (a loop's ``"step"``), evenly picked."""
    seen: set[str] = set()
    firsts, repeats = [], []
    for point in labels:
        if point.label:
            (repeats if point.label in seen else firsts).append(point)
            seen.add(point.label)
    chosen = _evenly(firsts, limit) + _evenly(repeats, max(0, limit - len(firsts)))
    return sorted(chosen, key=lambda p: p.elapsed)


def _evenly(items: list[LabelPoint], count: int) -> list[LabelPoint]:
    if len(items) <= count:
        return items
    if count <= 1:
        return items[:count]
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]
