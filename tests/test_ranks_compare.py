"""``compare --by rank`` and ``plot`` of a launch folder's ranks, on launches made in
process (the rank from an injected environment)."""

from __future__ import annotations

import io
import json
import re
import textwrap
from pathlib import Path

import pytest

from gpu_mem_track.cli import main
from gpu_mem_track.runner.options import RunOptions
from gpu_mem_track.runner.run import execute, prepare
from gpu_mem_track.runs.ranks import compare_launches, expand_launches, render_rank_comparison


def make_launch(tmp_path: Path, name: str, world: int = 2) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("data = [bytearray(1 << 20) for _ in range(4)]\n"))
    for rank in range(world):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}
        options = RunOptions(str(script), out_dir=str(tmp_path / "reports"), run_name=name, rank_wait=0)
        execute(prepare(options, env), io.StringIO())
    return tmp_path / "reports" / name


def set_peak(launch: Path, rank: int, peak: int, phase: str = "") -> None:
    """Give a rank a known peak (the real ones are the process's RSS)."""
    path = launch / f"rank{rank}" / "meta.json"
    meta = json.loads(path.read_text())
    meta.update(peak=peak, peak_at="train.py:1", peak_phase=phase)
    path.write_text(json.dumps(meta))


def test_the_ranks_of_one_launch_against_rank_0(tmp_path):
    launch = make_launch(tmp_path, "a")
    set_peak(launch, 0, 100 << 20, "forward")
    set_peak(launch, 1, 150 << 20)
    comparison = compare_launches(launch)
    assert [(row.rank, row.difference) for row in comparison.rows] == [(0, 0), (1, 50 << 20)]
    text = render_rank_comparison(comparison)
    assert text.splitlines()[0] == "Launch a: 2 ranks (spread 1.500); Diff: the rank's peak minus rank 0's"
    assert "train.py:1 (forward)" in text and "+50.00 MiB" in text


def test_two_launches_rank_by_rank(tmp_path):
    first, second = make_launch(tmp_path, "a"), make_launch(tmp_path, "b", world=3)
    for launch, peaks in ((first, (100, 100)), (second, (80, 90, 70))):
        for rank, mib in enumerate(peaks):
            set_peak(launch, rank, mib << 20)
    comparison = compare_launches(first, second)
    assert [row.difference for row in comparison.rows] == [-20 << 20, -10 << 20, None]
    assert "(no such rank)" in render_rank_comparison(comparison)


def test_compare_by_rank_on_the_command_line(tmp_path, capsys):
    launch = make_launch(tmp_path, "a")
    assert main(["compare", str(launch)]) == 0  # a launch folder: --by rank is the default
    assert capsys.readouterr().out.startswith("Launch a: 2 ranks")
    assert main(["compare", "--by", "rank", str(launch), str(launch)]) == 0
    assert capsys.readouterr().out.startswith("A a")
    assert main(["compare", "--by", "rank", str(tmp_path)]) == 2
    assert "is not a launch folder" in capsys.readouterr().err
    assert main(["compare", str(launch / "rank0")]) == 2
    assert "needs two runs" in capsys.readouterr().err


def test_plot_of_a_launch_overlays_its_ranks(tmp_path):
    pytest.importorskip("matplotlib")
    from gpu_mem_track.runs.load import load_run
    from gpu_mem_track.runs.plot import plot_files, timeline_figure

    launch = make_launch(tmp_path, "a")
    assert expand_launches([launch, tmp_path / "x"]) == [launch / "rank0", launch / "rank1", tmp_path / "x"]
    runs = [load_run(path, lines=False) for path in expand_launches([launch])]
    assert [run.name for run in runs] == ["a/rank0", "a/rank1"]
    figure = timeline_figure(runs)
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert any("a/rank0" in text for text in legend) and any("a/rank1" in text for text in legend)
    plotted = plot_files([launch], tmp_path / "ranks.png")
    assert plotted.path == tmp_path / "ranks.png" and plotted.notes == ()
    assert plotted.path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_ranks_command_rebuilds_the_table(tmp_path, capsys):
    launch = make_launch(tmp_path, "a")
    set_peak(launch, 1, 7 << 20, "backward")
    (launch / "ranks.csv").unlink()
    assert main(["ranks", str(launch)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpu_mem_track launch a:") and "train.py:1 (backward)" in out
    # The rank's device as its run recorded it: cpu without a GPU; on one, the CUDA device
    # the runner chose for local rank 1 (cuda:0 where it is the only one and CUDA runs).
    device = json.loads((launch / "rank1" / "meta.json").read_text())["device"]
    assert device == "cpu" or re.fullmatch(r"cuda:\d+", device), device
    assert (launch / "ranks.csv").read_text().splitlines()[2].startswith(f"1,ok,{device},7340032,")
    assert main(["ranks", str(tmp_path / "nothing")]) == 2
    assert "no such launch folder" in capsys.readouterr().err


def test_a_launch_folder_given_where_a_run_is_needed_says_what_to_do(tmp_path, capsys):
    launch = make_launch(tmp_path, "a")
    assert main(["compare", "--by", "line", str(launch), str(launch / "rank0")]) == 2
    assert "is a launch folder of a distributed run" in capsys.readouterr().err
