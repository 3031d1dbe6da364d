"""plot: downsampling, what the chart holds, the image files, a missing matplotlib."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from runfiles import MIB, runner_folder, tracker_csv

from gpu_mem_track.runfolder.read import LabelPoint, Sample, downsample
from gpu_mem_track.runs.load import load_run

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def cli(*args, cwd=None, code=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = ["-c", code, *args] if code else ["-m", "gpu_mem_track", *args]
    return subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def training(steps: int = 30, scale: float = 1.0, labels: bool = True) -> list[dict]:
    """A CUDA run's timeline: 512 MiB of weights, then steps that climb and fall back,
    the driver figure sampled every third event, a ``track("step N")`` after each step."""
    rows = [{"elapsed": 0.0, "event": "start", "memory": 0, "allocated": 0, "reserved": 0}]
    elapsed, base = 0.1, 512 * MIB
    rows.append({"elapsed": elapsed, "event": "line", "memory": base, "allocated": base, "reserved": base})
    for step in range(steps):
        for k in range(5):
            elapsed += 0.01
            memory = base + int(scale * (k + 1) * 100 * MIB)
            driver = memory + 600 * MIB if k % 3 == 0 else None
            row = {"memory": memory, "allocated": memory, "reserved": base + 600 * MIB, "driver": driver}
            rows.append({"elapsed": elapsed, "event": "line", "file": "/src/train.py", "line": 20 + k, **row})
        if labels:
            track = {"label": f"step {step}", "memory": base, "function": "main", "file": "/src/train.py"}
            rows.append({"elapsed": elapsed + 0.001, "event": "track", **track})
    return rows


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_downsample_keeps_the_extremes_in_order_within_the_cap():
    values = [(i * 7919) % 1000 for i in range(100_000)]
    values[54_321] = 5_000  # a lone spike
    values[77_777] = -5_000  # a lone trough
    kept = downsample((Sample(float(i), v) for i, v in enumerate(values)), points=100)
    assert 100 <= len(kept) <= 200
    assert max(s.memory for s in kept) == 5_000 and min(s.memory for s in kept) == -5_000
    times = [s.elapsed for s in kept]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_downsample_leaves_short_series_alone():
    samples = [Sample(float(i), i % 3) for i in range(50)]
    assert downsample(samples, points=50) == samples


def test_figure_holds_curves_peak_and_deduplicated_labels(tmp_path):
    from gpu_mem_track.runs.plot import timeline_figure

    fp32 = load_run(runner_folder(tmp_path, "fp32", timeline=training(scale=2.0)))
    amp = load_run(runner_folder(tmp_path, "amp", timeline=training()))  # same labels at the same times
    axes = timeline_figure([fp32, amp]).axes[0]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == [
        "fp32: allocated",
        "fp32: reserved",
        "fp32: driver",
        "amp: allocated",
        "amp: reserved",
        "amp: driver",
    ]
    assert axes.get_ylabel() == "memory (GiB)" and axes.get_title() == "fp32 vs amp"
    texts = [text.get_text().strip() for text in axes.texts]
    assert [t for t in texts if t.startswith("peak")] == ["peak 1.48 GiB", "peak 1012.00 MiB"]
    labels = [t for t in texts if t.startswith("step")]
    assert len(labels) == 20 and labels[0] == "step 0" and labels[-1] == "step 29"  # written once
    assert len(axes.lines) == 6 + 2 + 2 * 20  # curves, peak markers, a vertical line per label and run


def test_curves_are_steps_and_a_cpu_tracker_s_rss_has_its_own_axis(tmp_path):
    from gpu_mem_track.runs.plot import drawn_path, timeline_figure

    csv = tracker_csv(tmp_path / "cpu.csv", [("a", 1.0, 2 * MIB), ("b", 2.0, 24 * MIB)], device="cpu")
    figure = timeline_figure([load_run(csv)])
    tensors_axes, rss_axes = figure.axes
    (tensors,) = tensors_axes.lines[:1]
    # a reading holds until the next: 2 MiB from 1 s to 2 s, then up to 24 MiB (no ramp)
    assert tensors.get_drawstyle() == "steps-post"
    assert drawn_path(tensors).tolist() == [[1.0, 2.0], [2.0, 2.0], [2.0, 24.0]]
    assert tensors_axes.get_ylim()[1] < 60  # the tensors' axis is not stretched to the RSS
    (rss,) = rss_axes.lines
    assert rss.get_ydata().tolist() == [102.0, 124.0]
    assert rss_axes.get_ylabel() == "process RSS (MiB, dash-dot)"
    legend = [text.get_text() for text in tensors_axes.get_legend().get_texts()]
    assert legend == ["cpu: tensors", "cpu: RSS (right axis)"]


def stamps(*labels: str) -> list[LabelPoint]:
    return [LabelPoint(label, float(i), 0, "f.py", "main", 1) for i, label in enumerate(labels)]


def test_pick_labels_prefers_first_occurrences_then_fills_with_repeats():
    from gpu_mem_track.runs.plot import pick_labels

    assert [p.elapsed for p in pick_labels(stamps("a", "", "b", "a", "c"))] == [0.0, 2.0, 3.0, 4.0]
    loop = pick_labels(stamps("model", *["step"] * 100), limit=5)
    assert [(p.label, p.elapsed) for p in loop] == [
        ("model", 0.0),
        ("step", 1.0),
        ("step", 2.0),
        ("step", 51.0),
        ("step", 100.0),
    ]
    distinct = pick_labels(stamps(*[f"s{i}" for i in range(100)], "s0"), limit=5)
    assert [p.label for p in distinct] == ["s0", "s25", "s50", "s74", "s99"]  # no slot left for repeats


def test_spread_keeps_order_and_gap_and_centres_each_crowd():
    from gpu_mem_track.runs.layout import spread

    assert spread([10, 10, 10], gap=10, low=0, high=100) == [0, 10, 20]  # centred on 10
    assert spread([0, 1, 50, 51, 52], gap=10, low=0, high=100) == [0, 10, 41, 51, 61]
    assert spread([95, 96, 97], gap=10, low=0, high=100) == [80, 90, 100]  # held inside the bounds
    assert spread([5, 30, 80], gap=10, low=0, high=100) == [5, 30, 80]  # apart already: unmoved
    with pytest.raises(ValueError, match="ascending"):
        spread([2, 1], gap=1, low=0, high=10)


def test_occupancy_marks_the_squares_a_segment_crosses():
    from gpu_mem_track.runs.layout import occupancy

    grid = occupancy([[0, 5, 100, 5], [50, 0, 50, 100]], bounds=(0, 0, 100, 100), cell=10)
    assert grid.shape == (10, 10)
    assert grid[0].all() and grid[:, 5].all() and grid.sum() == 19  # a row and a column
    diagonal = occupancy([[0, 0, 99.9, 99.9]], bounds=(0, 0, 100, 100), cell=10)
    assert [tuple(cell) for cell in zip(*diagonal.nonzero())] == [(i, i) for i in range(10)]


def test_place_box_takes_the_nearest_spot_no_curve_crosses():
    import numpy as np

    from gpu_mem_track.runs.layout import occupancy, overlaps, place_box

    bounds = (0, 0, 200, 100)
    grid = occupancy(np.array([[0, 50, 200, 50], [0, 60, 200, 60]]), bounds, cell=2)  # a band of two lines
    # The peak sits between the lines; the nearest free spot at least 8 px (the clearance) from it
    # is just under the lower line, its right edge 4 px left of the peak (sqrt(4² + 7²) >= 8).
    assert place_box((100, 55), (40, 10), grid, bounds, cell=2) == (56, 38, 96, 48)
    taken = [(0, 0, 200, 49)]  # below is another text's: the same spot above the upper line
    above = place_box((100, 55), (40, 10), grid, bounds, taken, cell=2)
    assert above == (56, 62, 96, 72) and not overlaps(above, taken[0])
    full = np.ones_like(grid)
    # No free spot: every spot covers as much, so the nearest, its right edge 8 px left of the peak
    assert place_box((100, 55), (40, 10), full, bounds, cell=2) == (52, 46, 92, 56)


def _boxes(texts, renderer):
    return [t.get_window_extent(renderer).extents for t in texts]


def test_labels_do_not_overlap_and_peaks_cover_no_curve(tmp_path):
    import numpy as np

    from gpu_mem_track.runs.layout import occupancy, overlaps
    from gpu_mem_track.runs.plot import drawn_path, timeline_figure

    crowded = training(steps=4)
    crowded += [
        {"elapsed": 0.1 + i / 1000, "event": "track", "label": name, "memory": 512 * MIB}
        for i, name in enumerate(["model built", "optimizer ready", "data loaded"])
    ]
    crowded.sort(key=lambda row: row["elapsed"])
    runs = [
        load_run(runner_folder(tmp_path, "fp32", timeline=crowded)),
        load_run(runner_folder(tmp_path, "amp", timeline=training(steps=4, scale=0.5))),
    ]
    figure = timeline_figure(runs)
    figure.canvas.draw()  # places the peaks' boxes
    renderer = figure.canvas.get_renderer()
    axes = figure.axes[0]
    labels = [t for t in axes.texts if t.get_rotation() == 90]
    written = {t.get_text().strip() for t in labels}
    assert {"model built", "optimizer ready", "data loaded", "step 0"} <= written
    boxes = _boxes(labels, renderer)
    assert not any(overlaps(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    peaks = [t for t in axes.texts if t.get_text().startswith("peak")]
    assert len(peaks) == 2
    frame = axes.get_window_extent(renderer).extents
    curves = [line for line in axes.lines if len(line.get_xydata()) > 2]  # not the stamps or markers
    segments = np.vstack(
        [np.hstack([p[:-1], p[1:]]) for p in (c.get_transform().transform(drawn_path(c)) for c in curves)]
    )
    grid = occupancy(segments, tuple(frame), cell=1)
    for box in [peak.get_bbox_patch().get_window_extent(renderer).extents for peak in peaks]:
        left, bottom, right, top = (int(v - o) for v, o in zip(box, (frame[0], frame[1]) * 2))
        assert not grid[bottom:top, left:right].any()  # no curve under the text
        assert not any(overlaps(box, label) for label in boxes)


@pytest.mark.slow
def test_cli_plots_one_run_to_a_png(tmp_path):
    run = runner_folder(tmp_path, "fp32", timeline=training())
    done = cli("plot", str(run), "-o", str(tmp_path / "one.png"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote {tmp_path / 'one.png'}\n"
    assert png_size(tmp_path / "one.png") == (1210, 638)
    assert (tmp_path / "one.png").stat().st_size > 20_000


@pytest.mark.slow
def test_cli_overlays_runs_and_a_tracker_csv_with_a_title(tmp_path, monkeypatch, in_process):
    a = runner_folder(tmp_path, "fp32", timeline=training())
    b = runner_folder(tmp_path, "amp", timeline=training(scale=0.5))
    tracker = tracker_csv(
        tmp_path / "cpu.csv", [("model", 0.1, 300 * MIB), ("step", 0.4, 900 * MIB)], device="cpu"
    )
    monkeypatch.chdir(tmp_path)
    done = in_process("plot", a, b / "timeline.csv", tracker, "--title", "three runs")
    assert done.returncode == 0, done.stderr
    assert png_size(tmp_path / "timeline.png") == (1210, 638)  # the default output name
    assert (tmp_path / "timeline.png").stat().st_size > 20_000


@pytest.mark.slow
def test_cli_plot_without_a_suffix_writes_png_and_says_where(tmp_path):
    from gpu_mem_track.runs.plot import image_path

    assert image_path("out") == Path("out.png") and image_path("a.b/out") == Path("a.b/out.png")
    assert image_path("out.svg") == Path("out.svg")
    run = runner_folder(tmp_path, "fp32", timeline=training(steps=2))
    done = cli("plot", str(run), "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "wrote out.png\n" and png_size(tmp_path / "out.png") == (1210, 638)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_plot_of_a_killed_run_uses_its_timeline_and_names_what_is_missing(tmp_path):
    run = runner_folder(tmp_path, "killed", timeline=training(steps=2))
    done = cli("plot", str(run), str(runner_folder(tmp_path, "empty")), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        f"gpu_mem_track: {tmp_path / 'empty'} has no memory over time to plot (it has no timeline.csv: "
        "the run stopped before it recorded anything)\n"
    )
    timeline = run / "timeline.csv"
    timeline.write_text(timeline.read_text()[:-9])  # killed mid-row
    done = cli("plot", str(run), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"gpu_mem_track: note: {timeline}, line ")
    assert "the last row is incomplete" in done.stderr and done.stderr.count("\n") == 1


def test_cli_plot_writes_svg_by_suffix(tmp_path, in_process):
    tracker = tracker_csv(tmp_path / "t.csv", [("model", 0.1, 300 * MIB), ("step", 0.4, 900 * MIB)])
    done = in_process("plot", tracker, "-o", tmp_path / "t.svg")
    assert done.returncode == 0, done.stderr
    svg = (tmp_path / "t.svg").read_text()
    assert "<svg" in svg and "peak 900.00 MiB" in svg


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("missing",), "gpu_mem_track: no such run or report: missing\n"),
        (("run/lines.csv",), "gpu_mem_track: run/lines.csv has no memory over time to plot (lines.csv holds"),
        (("t.csv", "-o", "no/such/dir/x.png"), "gpu_mem_track: cannot write no/such/dir/x.png: "),
        (("t.csv", "-o", "x.nope"), "gpu_mem_track: cannot write x.nope: Format 'nope' is not supported"),
    ],
)
def test_cli_plot_mistakes_exit_2_with_one_line(tmp_path, monkeypatch, in_process, args, message):
    from runfiles import line

    runner_folder(tmp_path, "run", [line("x = 1", 1, 1, 1)])
    tracker_csv(tmp_path / "t.csv", [("model", 0.1, MIB)])
    monkeypatch.chdir(tmp_path)
    done = in_process("plot", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1
    assert not (tmp_path / "timeline.png").exists()


def test_cli_plot_without_matplotlib_exits_1_saying_how_to_install(tmp_path):
    tracker = tracker_csv(tmp_path / "t.csv", [("model", 0.1, MIB)])
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from gpu_mem_track.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))"
    )
    done = cli("plot", str(tracker), cwd=tmp_path, code=code)
    assert done.returncode == 1
    assert done.stderr == 'gpu_mem_track: plotting needs matplotlib: pip install "gpu_mem_track[plot]"\n'
    assert not (tmp_path / "timeline.png").exists()


@pytest.mark.slow
def test_plotting_leaves_pyplot_and_torch_unimported(tmp_path):
    tracker = tracker_csv(tmp_path / "t.csv", [("model", 0.1, MIB)])
    code = (
        "import sys\n"
        "from gpu_mem_track.runs.plot import plot_files\n"
        "plot_files(sys.argv[1:], 'out.png')\n"
        "print(sorted(m for m in ('matplotlib.pyplot', 'torch') if m in sys.modules))"
    )
    done = cli(str(tracker), cwd=tmp_path, code=code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n" and png_size(tmp_path / "out.png") == (1210, 638)
