"""A line's transient peak on the timelines (``runs.transients``): drawn where it happened,
never as a spike at the end of the enclosing ``main()`` line (issue 16, item 14)."""

from __future__ import annotations

from runfiles import MIB, runner_folder

from gpu_mem_track.html.data import collect
from gpu_mem_track.runfolder.records import TimelineRow
from gpu_mem_track.runfolder.transients import PeakPlacer, raised_peaks
from gpu_mem_track.runs.load import load_run


def row(elapsed: float, function: str, line: int, memory: int, peak: int | None = None) -> dict:
    """A ``line`` row of /src/train.py (memory and peak in MiB)."""
    return dict(
        elapsed=elapsed,
        event="line",
        file="/src/train.py",
        function=function,
        line=line,
        memory=memory * MIB,
        increment=0,
        peak=(memory if peak is None else peak) * MIB,
    )


START = dict(elapsed=0.0, event="start", file="/src/train.py", function="<module>", memory=0)


def main_call(inner_peaks: tuple[int, int, int], outer_peak: int) -> list[dict]:
    """``main()`` called at module level: three lines inside it, then the call line, whose
    peak spans them all, then one more module line."""
    return [
        START,
        row(0.1, "<module>", 1, 0),
        row(0.2, "main", 10, 4, inner_peaks[0]),
        row(0.3, "main", 11, 6, inner_peaks[1]),
        row(0.4, "main", 12, 2, inner_peaks[2]),
        row(0.5, "<module>", 19, 0, outer_peak),
        row(0.6, "<module>", 20, 1),
    ]


def drawn(rows: list[dict]) -> list[tuple[float, int]]:
    """``(elapsed, MiB)`` of every point ``load_run`` draws."""
    typed = [TimelineRow.from_dict({"seq": i, **r}) for i, r in enumerate(rows)]
    placer = PeakPlacer(raised_peaks(typed))
    out = []
    for index, r in enumerate(typed):
        transient = placer.place(index, r)
        if transient is not None:
            out.append((r.elapsed, transient // MIB))
        out.append((r.elapsed, r.memory // MIB))
    return out


def test_the_call_line_s_peak_is_not_drawn_again_at_its_end(tmp_path):
    rows = main_call((4, 9, 6), outer_peak=9)
    folder = runner_folder(tmp_path, "run", timeline=rows, device="cpu")
    samples = [(s.elapsed, s.memory // MIB) for s in load_run(folder).samples]
    # 9 MiB once, inside line 11 where it happened; the call line ends at 0 with no spike
    assert samples == [(0.0, 0), (0.1, 0), (0.2, 4), (0.3, 9), (0.3, 6), (0.4, 2), (0.5, 0), (0.6, 1)]
    points = collect([folder])["runs"][0]["points"]
    assert [(p[0], p[1] // MIB) for p in points] == samples
    assert points[3][2] == "train.py:11 main (peak while it ran)"


def test_a_peak_no_callee_reached_is_drawn_at_the_callee_row_with_the_highest_value():
    # the callees' peaks are lower bounds (4, 6, 6 MiB): the call line saw 12 MiB somewhere
    # inside; drawn at line 11 (the highest callee value), not at the call's end
    assert drawn(main_call((4, 6, 6), outer_peak=12)) == [
        (0.0, 0), (0.1, 0), (0.2, 4), (0.3, 12), (0.3, 6), (0.4, 2), (0.5, 0), (0.6, 1),
    ]  # fmt: skip


def test_a_leaf_line_s_peak_is_drawn_before_its_end_value_and_the_start_value_counts():
    rows = [
        START,
        row(0.1, "<module>", 1, 8),
        row(0.2, "<module>", 2, 3, peak=8),  # fell from 8: its peak was its start, drawn already
        row(0.3, "<module>", 3, 3, peak=11),  # rose inside an untraced call and fell back
    ]
    assert drawn(rows) == [(0.0, 0), (0.1, 8), (0.2, 3), (0.3, 11), (0.3, 3)]


def test_repeated_calls_each_draw_their_own_peak_once():
    rows = [START]
    for call in range(2):
        t = call * 0.5
        rows += [row(t + 0.1, "step", 5, 2, 7), row(t + 0.2, "step", 6, 0, 2)]
        rows.append(row(t + 0.3, "<module>", 9, 0, 7))
    points = drawn(rows)
    assert [p for p in points if p[1] == 7] == [(0.1, 7), (0.6, 7)]


def test_a_caller_whose_first_line_called_traced_code_draws_no_second_spike():
    rows = [
        START,
        row(0.1, "train", 3, 5, 9),
        row(0.2, "train", 4, 2),
        row(0.3, "main", 1, 2, 9),  # main's first line was train(): its row comes after train's
        row(0.4, "<module>", 20, 0, 9),
    ]
    assert [p for p in drawn(rows) if p[1] == 9] == [(0.1, 9)]
