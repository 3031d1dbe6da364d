"""Memory over time, like ``mprof plot``: one or more runs on one chart, written as an
image file.

Per run, in one color: the run's memory (solid; the allocator's allocated bytes on CUDA,
the process RSS or the census's tensor bytes elsewhere, as the legend says), the
allocator's reserved bytes (dashed) and the driver's figure (dotted) where recorded, and
for a MemTracker CSV on the CPU the process RSS (dash-dot, on its own axis on the right:
hundreds of MiB of RSS beside a few MiB of tensors would flatten them), all drawn as
steps (a reading holds until the next one); the peak marked with a
triangle, its value written in the free spot nearest it that no curve crosses and no other
text covers, with an arrow to it; ``track()`` stamps as thin vertical lines (at most
``MAX_LABELS`` per run, see ``pick_labels``), each label's text written once along the top
(cut to 32 characters, room kept above the curves), moved sideways where labels crowd so
none overlaps another, a leader joining a moved label to its stamp (see ``layout``).
x: seconds since the run started; y: MiB, or GiB when a curve reaches 1 GiB.

Needs matplotlib (``pip install "gpu_mem_track[plot]"``); without it ``PlotUnavailable``
is raised. The chart is drawn on a ``matplotlib.figure.Figure`` rendered by the Agg
backend directly, so ``pyplot`` and the user's backend choice are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..runfolder.read import DEFAULT_POINTS, LabelPoint, Sample
from ..units import format_bytes
from .layout import Box, occupancy, place_box, spread
from .load import Run, detect, load_run

__all__ = [
    "MAX_LABELS",
    "PlotUnavailable",
    "Plotted",
    "drawn_path",
    "image_path",
    "pick_labels",
    "plot_files",
    "timeline_figure",
    "write_plot",
]

#: At most this many ``track()`` labels are annotated per run (evenly picked).
MAX_LABELS = 20

_GIB = 2**30
#: Stamp labels: longer ones are cut to this many characters; their top (axes fraction);
#: at most this fraction of the chart's height is kept free above the curves for them.
_LABEL_CHARS, _LABEL_TOP, _LABEL_ROOM = 32, 0.985, 0.4
_EXTRAS = (("reserved", "reserved", "--"), ("driver", "driver", ":"), ("rss", "RSS", "-."))
_MAIN_NAMES = {"cuda allocator": "allocated", "process RSS": "RSS", "tensors": "tensors"}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


@dataclass(frozen=True)
class Plotted:
    """What ``plot_files`` did: ``path``, the image written; ``notes``, one line each on
    what loading the runs had to do (see ``load.Run.notes``), for the caller to show."""

    path: Path
    notes: tuple[str, ...] = ()


def plot_files(
    paths: Sequence[str | Path], output: str | Path, title: str | None = None, points: int = DEFAULT_POINTS
) -> Plotted:
    """Load each run (see ``runs``; a launch folder stands for its ranks), draw them on
    one chart and write it to ``output`` (``image_path``: the format follows its suffix,
    png, svg, pdf...; none means PNG and ``.png`` is appended). ``UsageError`` for a path
    that cannot be loaded or has no timeline, or an output that cannot be written;
    ``PlotUnavailable`` without matplotlib (checked before loading)."""
    from .ranks import expand_launches

    _matplotlib()
    runs = [load_run(path, lines=False, points=points) for path in expand_launches(paths)]
    for run in runs:
        if not run.samples:
            raise UsageError(f"{run.path} has no memory over time to plot ({_why_empty(run)})")
    path = image_path(output)
    write_plot(runs, path, title)
    return Plotted(path, tuple(note for run in runs for note in run.notes))


def image_path(output: str | Path) -> Path:
    """Where ``plot_files`` writes for ``-o output``: ``output`` itself when it has a
    suffix (the format), else ``output`` with ``.png`` appended."""
    output = Path(output)
    return output if output.suffix else output.with_name(output.name + ".png")


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
    figure_class, canvas_class = _matplotlib()
    figure = figure_class(figsize=(11, 5.8))
    canvas_class(figure)  # an Agg canvas, to measure the texts before placing them
    axes = figure.add_subplot()
    drawn = [run for run in runs if run.samples]
    scale, unit = _unit(drawn)
    span = max((s.elapsed for run in drawn for s in run.samples or ()), default=0.0)
    written: list[tuple[str, float]] = []  # labels already written, to write each once across runs
    texts: list[Any] = []
    curves: list[Any] = []
    host = _host_axes(axes, drawn)
    for index, run in enumerate(drawn):
        color = f"C{index % 10}"
        curves += _draw_curves(axes, run, color, scale, host)
        texts += _mark_labels(axes, run, color, written, tolerance=span / 100)
    axes.set_xlabel("seconds since the start")
    axes.set_ylabel(f"memory ({unit})")
    axes.set_title(
        title if title is not None else " vs ".join(run.name for run in drawn) or "memory over time"
    )
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0, top=max(axes.get_ylim()[1], 1e-9))
    axes.grid(alpha=0.3)
    if drawn:
        # Outside the axes, on the right (past the RSS axis): inside it would hide the
        # labels or the curves.
        handles = axes.get_legend_handles_labels()
        if host is not None:
            more = host[0].get_legend_handles_labels()
            handles = (handles[0] + more[0], handles[1] + more[1])
        where = (1.09 if host is not None else 1.01, 1.0)
        axes.legend(*handles, loc="upper left", bbox_to_anchor=where, fontsize=8, frameon=False)
    taken = _place_labels(figure, axes, texts)
    if host is not None:  # the same room above the RSS curves as above the others
        highest = max((max(line.get_ydata()) for line in curves if line.axes is axes), default=0)
        ratio = axes.get_ylim()[1] / highest if highest > 0 else 1.1
        host[0].set_ylim(top=max(ratio, 1.1) * host[2])
    for index, run in enumerate(drawn):
        peak = _highest(run.samples or ())
        if peak is not None:
            color = f"C{index % 10}"
            axes.plot([peak.elapsed], [peak.memory / scale], marker="^", markersize=9, color=color, zorder=5)
            taken.append(_around(axes, (peak.elapsed, peak.memory / scale), 7))
    _annotate_peaks(figure, axes, drawn, scale, curves, taken)
    return figure


def _place_labels(figure: Any, axes: Any, texts: list[Any]) -> list[Box]:
    """Make room above the curves for the rotated stamp labels, then spread them sideways
    so none overlaps another (a leader joins a moved label to its stamp). Returns the
    labels' boxes in pixels."""
    from matplotlib.transforms import blended_transform_factory

    renderer = figure.canvas.get_renderer()
    _make_room(figure, axes, texts)
    if not texts:
        return []
    frame = axes.get_window_extent(renderer)
    gap = max(t.get_window_extent(renderer).width for t in texts) + 2
    texts.sort(key=lambda t: t.get_position()[0])
    capacity = max(1, int((frame.width - gap) // gap) + 1)
    for dropped in set(texts) - set(_evenly(texts, capacity)):
        dropped.remove()  # more labels than fit side by side: their stamp lines stay
        texts.remove(dropped)
    to_pixels, to_data = axes.transData, axes.transData.inverted()
    wanted = [to_pixels.transform((t.get_position()[0], 0))[0] for t in texts]
    placed = spread(wanted, gap, frame.x0 + gap / 2, frame.x1 - gap / 2)
    where = blended_transform_factory(axes.transData, axes.transAxes)
    for text, stamp, pixel in zip(texts, wanted, placed):
        x = to_data.transform((pixel, 0))[0]
        text.set_x(x)
        if abs(pixel - stamp) > 0.5:
            leader = {"arrowstyle": "-", "color": text.get_color(), "lw": 0.6, "shrinkA": 0, "shrinkB": 0}
            start = to_data.transform((stamp, 0))[0]
            axes.annotate(
                "",
                xy=(start, 1.0),
                xytext=(x, _LABEL_TOP),
                xycoords=where,
                textcoords=where,
                arrowprops=leader,
                alpha=0.6,
            )
    return [tuple(t.get_window_extent(renderer).extents) for t in texts]


def _make_room(figure: Any, axes: Any, texts: list[Any]) -> None:
    """Raise the y limit so the curves stay below the longest label (at most
    ``_LABEL_ROOM`` of the height), then lay the figure out for the final tick labels."""
    renderer = figure.canvas.get_renderer()
    figure.tight_layout()
    longest = max((t.get_window_extent(renderer).height for t in texts), default=0.0)
    height = axes.get_window_extent(renderer).height
    room = min((longest + 8) / height, _LABEL_ROOM) if texts else 0.0
    axes.set_ylim(top=axes.get_ylim()[1] * 1.04 / (1 - room))
    figure.tight_layout()


def _annotate_peaks(
    figure: Any, axes: Any, runs: Sequence[Run], scale: float, curves: list, taken: list
) -> None:
    """Each run's peak value, in the free spot nearest its marker that no curve crosses
    and no other text covers, with an arrow to the marker."""
    renderer = figure.canvas.get_renderer()
    frame = axes.get_window_extent(renderer)
    bounds = (frame.x0 + 2, frame.y0 + 2, frame.x1 - 2, frame.y1 - 2)
    grid = occupancy(_segments(curves), bounds)
    for index, run in enumerate(runs):
        top = _highest(run.samples or ())
        if top is None:
            continue
        color = f"C{index % 10}"
        point = (top.elapsed, top.memory / scale)
        style = {"fontsize": 8, "color": color, "fontweight": "bold", "ha": "center", "va": "center"}
        probe = axes.text(0, 0, f"peak {format_bytes(top.memory)}", **style)
        extent = probe.get_window_extent(renderer)  # the text alone, to size its box
        probe.remove()
        pad = 0.2 * 8 * figure.dpi / 72 + 2  # the box's padding, and a little air
        anchor = tuple(axes.transData.transform(point))
        box = place_box(anchor, (extent.width + 2 * pad, extent.height + 2 * pad), grid, bounds, taken)
        taken.append(box)
        centre = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
        axes.annotate(
            f"peak {format_bytes(top.memory)}",
            point,
            xytext=tuple(axes.transAxes.inverted().transform(centre)),
            textcoords="axes fraction",
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
            arrowprops={"arrowstyle": "-|>", "color": color, "lw": 0.8, "shrinkA": 1, "shrinkB": 6},
            zorder=6,
            **style,
        )


def _segments(lines: list[Any]) -> Any:
    """The straight pieces of ``lines`` in pixels, an ``(n, 4)`` array."""
    import numpy as np

    pieces = [
        np.hstack([points[:-1], points[1:]])
        for points in (line.get_transform().transform(drawn_path(line)) for line in lines)
        if len(points) > 1
    ]
    return np.vstack(pieces) if pieces else np.zeros((0, 4))


def drawn_path(line: Any) -> Any:
    """The points of a ``Line2D`` as drawn: its steps expanded (``steps-post``), an
    ``(n, 2)`` array in data coordinates."""
    import numpy as np
    from matplotlib.cbook import pts_to_poststep

    xy = np.asarray(line.get_xydata(), dtype=float)
    if line.get_drawstyle() != "steps-post" or len(xy) < 2:
        return xy
    return np.column_stack(pts_to_poststep(xy[:, 0], xy[:, 1]))


def _around(axes: Any, point: tuple[float, float], radius: float) -> Box:
    x, y = axes.transData.transform(point)
    return (x - radius, y - radius, x + radius, y + radius)


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable('plotting needs matplotlib: pip install "gpu_mem_track[plot]"') from exc
    return Figure, FigureCanvasAgg


def _why_empty(run: Run) -> str:
    if run.kind == "tracker":
        return "no track() stamps yet"
    if run.path.is_file() and detect(run.path).kind == "lines":
        return f"{run.path.name} holds per-line totals; plot the run folder or its timeline.csv"
    if run.path.is_file():
        return "its rows hold no memory figure"
    if not (run.path / "timeline.csv").is_file():
        return "it has no timeline.csv: the run stopped before it recorded anything"
    return "its timeline.csv holds no memory figure"


def _unit(runs: Sequence[Run]) -> tuple[float, str]:
    """MiB, or GiB when a curve on the memory axis reaches 1 GiB (RSS has its own axis)."""
    highest = 0
    for run in runs:
        for sample in run.samples or ():
            values = [sample.memory] + [getattr(sample, name) for name, _, _ in _EXTRAS if _shows(run, name)]
            highest = max([highest] + [v for v in values if v is not None])
    return (_GIB, "GiB") if highest >= _GIB else (2**20, "MiB")


def _shows(run: Run, field: str) -> bool:
    """Whether ``field`` is drawn on the memory axis: RSS never (host memory, drawn on an
    axis of its own beside a CPU run's tensor bytes, see ``_host_axes``)."""
    return field != "rss"


def _shows_rss(run: Run) -> bool:
    # only beside a CPU run's tensor bytes: never beside GPU memory, and not twice when it
    # is the run's memory already
    return run.memory_source == "tensors" and any(s.rss is not None for s in run.samples or ())


def _host_axes(axes: Any, runs: Sequence[Run]) -> tuple[Any, float, float] | None:
    """A second y axis on the right for the process RSS of CPU tracker runs, its scale
    and the highest RSS in that unit (hundreds of MiB of RSS beside a few MiB of tensors
    would flatten them)."""
    if not any(_shows_rss(run) for run in runs):
        return None
    highest = max(s.rss or 0 for run in runs if _shows_rss(run) for s in run.samples or ())
    scale, unit = (_GIB, "GiB") if highest >= _GIB else (2**20, "MiB")
    host = axes.twinx()
    host.set_ylabel(f"process RSS ({unit}, dash-dot)")
    host.set_ylim(bottom=0, top=highest / scale * 1.1 or 1)
    return host, scale, highest / scale


def _draw_curves(
    axes: Any, run: Run, color: str, scale: float, host: tuple[Any, float, float] | None = None
) -> list[Any]:
    """The run's curves as steps (memory is read at each event and holds until the next)."""
    samples = run.samples or ()
    style = {"marker": ".", "markersize": 5} if len(samples) <= 60 else {}
    main = _MAIN_NAMES.get(run.memory_source, run.memory_source or "memory")
    lines = axes.plot(
        [s.elapsed for s in samples],
        [s.memory / scale for s in samples],
        color=color,
        linewidth=1.6,
        label=f"{run.name}: {main}",
        drawstyle="steps-post",
        **style,
    )
    for field, name, dashes in _EXTRAS:
        known = [s for s in samples if getattr(s, field) is not None]
        on_host = field == "rss" and host is not None and _shows_rss(run)
        if not known or not (_shows(run, field) or on_host):
            continue
        target, factor = (host[0], host[1]) if on_host and host is not None else (axes, scale)
        lines += target.plot(
            [s.elapsed for s in known],
            [getattr(s, field) / factor for s in known],
            color=color,
            linestyle=dashes,
            linewidth=1.1,
            alpha=0.75,
            label=f"{run.name}: {name}" + (" (right axis)" if on_host else ""),
            drawstyle="steps-post",
        )
    return lines


def _highest(samples: Sequence[Sample]) -> Sample | None:
    best = None
    for sample in samples:
        if best is None or sample.memory > best.memory:
            best = sample
    return best


def _mark_labels(
    axes: Any, run: Run, color: str, written: list[tuple[str, float]], tolerance: float
) -> list[Any]:
    """The run's stamp lines, and its label texts at the top (returned, to be placed)."""
    from matplotlib.transforms import blended_transform_factory

    where = blended_transform_factory(axes.transData, axes.transAxes)
    named: set[str] = set()
    texts = []
    for point in pick_labels(run.labels or ()):
        axes.axvline(point.elapsed, color=color, linewidth=0.8, linestyle=(0, (2, 3)), alpha=0.45)
        if point.label in named:
            continue  # a repeat ("step" in a loop): its line, without the text again
        named.add(point.label)
        if any(text == point.label and abs(x - point.elapsed) <= tolerance for text, x in written):
            continue  # another run has the same label here: one text is enough
        written.append((point.label, point.elapsed))
        text = axes.text(
            point.elapsed,
            _LABEL_TOP,
            _shorten(point.label),
            transform=where,
            rotation=90,
            va="top",
            ha="center",
            fontsize=7,
            color=color,
            clip_on=True,
        )
        text.set_in_layout(False)
        texts.append(text)
    return texts


def _shorten(label: str) -> str:
    return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 1] + "…"


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
