"""compare: loading runs, matching lines/functions/labels, ranking, rendering, the CLI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runfiles import MIB, line, runner_folder, tracker_csv

from gpu_mem_track.csvrows import CompleteRows
from gpu_mem_track.errors import UsageError
from gpu_mem_track.runs.compare import compare_files, compare_runs, render_comparison
from gpu_mem_track.runs.load import detect, load_run

ROOT = Path(__file__).resolve().parents[1]

BEFORE = [
    line("model = build()", 10, 500, 500),
    line("out = model(x)", 11, 300, 900),
    line("x = x + 1", 12, 4, 904),
    line("x = x + 1", 13, 8, 912),
    line("del out", 14, -300, 912),
]
# An import inserted above shifts every line by one; the forward pass now takes twice as much,
# one new line allocates, and "del out" is gone.
AFTER = [
    line("import extra", 10, 1, 1),
    line("model = build()", 11, 500, 501),
    line("out = model(x)", 12, 600, 1200),
    line("x = x + 1", 13, 4, 1204),
    line("x = x + 1", 14, 16, 1220),
    line("cache = keep(out)", 15, 50, 1270),
]


def cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.fixture
def two_runs(tmp_path):
    a = runner_folder(tmp_path, "before", BEFORE, peak=912 * MIB)
    b = runner_folder(tmp_path, "after", AFTER, peak=1270 * MIB)
    return a, b


def by_code(comparison):
    return {(row.key[-1], row.occurrence): row for row in comparison.rows}


def test_lines_match_by_text_when_line_numbers_shift(two_runs):
    comparison = compare_files(*two_runs)
    assert comparison.by == "line"
    rows = by_code(comparison)
    forward = rows[("out = model(x)", 1)]
    assert (forward.a.where, forward.b.where) == ("11", "12")
    assert forward.difference == 300 * MIB
    assert forward.peak_difference == 300 * MIB
    build = rows[("model = build()", 1)]
    assert (build.a.where, build.b.where, build.difference) == ("10", "11", 0)


def test_the_same_text_twice_in_a_function_matches_in_order(two_runs):
    rows = by_code(compare_files(*two_runs))
    first, second = rows[("x = x + 1", 1)], rows[("x = x + 1", 2)]
    assert (first.a.where, first.b.where, first.difference) == ("12", "13", 0)
    assert (second.a.where, second.b.where, second.difference) == ("13", "14", 8 * MIB)


def test_lines_in_one_run_only_have_an_empty_side_and_count_from_zero(two_runs):
    rows = by_code(compare_files(*two_runs))
    gone, new = rows[("del out", 1)], rows[("cache = keep(out)", 1)]
    assert gone.b is None and gone.difference == 300 * MIB and gone.peak_difference is None
    assert new.a is None and new.difference == 50 * MIB


def test_rows_come_largest_difference_first(two_runs):
    order = [(row.key[-1], row.difference // MIB) for row in compare_files(*two_runs).rows]
    assert order == [
        ("out = model(x)", 300),
        ("del out", 300),
        ("cache = keep(out)", 50),
        ("x = x + 1", 8),
        ("import extra", 1),
        ("x = x + 1", 0),  # ties: the larger peak difference first (+300 MiB here, +1 MiB below)
        ("model = build()", 0),
    ]


def test_by_function_sums_increments_and_takes_the_highest_peak(tmp_path):
    a = runner_folder(tmp_path, "a", [line("y = f(x)", 3, 10, 100, function="step"), *BEFORE])
    b = runner_folder(tmp_path, "b", [line("y = f(x)", 4, 10, 120, function="step"), *AFTER])
    comparison = compare_files(a, b, by="function")
    main, step = comparison.rows
    assert main.key == ("train.py", "main")
    assert main.a.value == 512 * MIB and main.b.value == 1171 * MIB and main.difference == 659 * MIB
    assert (main.a.peak, main.b.peak) == (912 * MIB, 1270 * MIB)
    assert (main.a.where, main.b.where) == ("10", "10")  # each function's first line
    assert step.key == ("train.py", "step") and step.difference == 0 and step.peak_difference == 20 * MIB


def test_by_label_on_tracker_csvs_compares_allocated_memory_by_occurrence(tmp_path):
    a = tracker_csv(
        tmp_path / "b32.csv", [("model", 0.1, 500 * MIB), ("step", 1.0, 900 * MIB), ("step", 2.0, 950 * MIB)]
    )
    b = tracker_csv(tmp_path / "b64.csv", [("model", 0.2, 500 * MIB), ("step", 1.5, 1300 * MIB)])
    comparison = compare_files(a, b)
    assert comparison.by == "label"
    assert comparison.a.memory_source == "cuda allocator" and comparison.a.name == "b32"
    assert [(r.key, r.occurrence, r.difference) for r in comparison.rows] == [
        (("step",), 1, 400 * MIB),
        (("model",), 1, 0),
        (("step",), 2, None),  # only in A: a memory level has no difference
    ]
    assert comparison.peak_difference == 350 * MIB


def test_tracker_csv_on_the_cpu_compares_tensor_bytes(tmp_path):
    path = tracker_csv(tmp_path / "cpu.csv", [("", 0.5, 7 * MIB)], device="cpu")
    run = load_run(path)
    assert run.memory_source == "tensors" and run.peak == 7 * MIB
    assert run.samples[0].rss == 107 * MIB
    comparison = compare_runs(run, run, "label")
    assert comparison.rows[0].key == ("(train.py main)",)  # a stamp without a label


def test_tracker_csv_with_extra_columns_is_still_recognised(tmp_path):
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB)])
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([row + [value] for row, value in zip(rows, ["cat_parameter", "0"])])
    assert detect(path).kind == "tracker"
    assert load_run(path).peak == MIB


def test_default_and_impossible_groupings(tmp_path, two_runs):
    tracker = tracker_csv(tmp_path / "t.csv", [("model", 0.1, MIB)])
    running = runner_folder(
        tmp_path, "running", timeline=[{"elapsed": 0.1, "event": "track", "label": "model", "memory": MIB}]
    )
    assert compare_files(tracker, running).by == "label"  # "running" has no lines.csv yet
    with pytest.raises(
        UsageError, match=r"by label \(the default when a run has no per-line records\): .*before has no"
    ):
        compare_files(two_runs[0], tracker)
    with pytest.raises(UsageError, match="t.csv is a MemTracker CSV, which has no per-line records"):
        compare_files(tracker, tracker, by="line")
    with pytest.raises(UsageError, match="before has no timeline.csv"):
        compare_files(two_runs[0], running, by="label")
    with pytest.raises(UsageError, match="lines.csv is a lines.csv, which has no track"):
        compare_files(two_runs[0] / "lines.csv", running, by="label")


def test_a_lines_csv_given_directly_takes_its_name_from_meta_json(two_runs):
    run = load_run(two_runs[0] / "lines.csv")
    assert run.name == "before" and run.kind == "runner" and len(run.lines) == 5 and run.samples is None


def test_runner_labels_come_from_track_events(tmp_path):
    timeline = [
        {"elapsed": 0.0, "event": "start", "memory": 0},
        {
            "elapsed": 0.5,
            "event": "line",
            "file": "/src/train.py",
            "function": "main",
            "line": 3,
            "memory": 4 * MIB,
            "peak": 6 * MIB,
        },
        {
            "elapsed": 0.6,
            "event": "track",
            "file": "/src/train.py",
            "function": "main",
            "line": 4,
            "label": "built",
            "memory": 4 * MIB,
        },
    ]
    run = load_run(runner_folder(tmp_path, "r", timeline=timeline))
    assert [(p.label, p.elapsed, p.memory) for p in run.labels] == [("built", 0.6, 4 * MIB)]
    # the line's transient peak is a sample of its own, before the line's end value
    assert [(s.elapsed, s.memory // MIB) for s in run.samples] == [(0.0, 0), (0.5, 6), (0.5, 4), (0.6, 4)]
    assert run.peak == 6 * MIB and run.events == 3  # no peak in meta.json: the highest sample


def test_render_label_comparison_exact_text(tmp_path):
    a = tracker_csv(tmp_path / "fp32.csv", [("model", 0.25, 512 * MIB), ("forward", 1.0, 2048 * MIB)])
    b = tracker_csv(tmp_path / "amp.csv", [("model", 0.5, 512 * MIB), ("forward", 1.25, 1536 * MIB)])
    assert render_comparison(compare_files(a, b)) == (
        "A fp32: peak 2.00 GiB | B amp: peak 1.50 GiB | B-A -512.00 MiB, -25.0%\n"
        "by label: memory (cuda allocator) at each track() stamp, matched by label and occurrence; "
        "largest difference first\n"
        "label      #    at A (s)    at B (s)    memory A    memory B          B-A\n"
        "-------  ---  ----------  ----------  ----------  ----------  -----------\n"
        "forward    1        1.00        1.25    2.00 GiB    1.50 GiB  -512.00 MiB\n"
        "model      1        0.25        0.50  512.00 MiB  512.00 MiB         +0 B\n"
    )


def test_render_line_comparison_lists_rows_in_rank_order_and_cuts_at_top(two_runs):
    text = render_comparison(compare_files(*two_runs), top=3)
    lines = text.splitlines()
    assert lines[0] == "A before: peak 912.00 MiB | B after: peak 1.24 GiB | B-A +358.00 MiB, +39.3%"
    headers = (
        "file function line A line B code increment A increment B B-A peak A peak B peak B-A hits A hits B"
    )
    assert lines[2].split() == headers.split()
    assert lines[4].split() == (
        "train.py main 11 12 out = model(x) 300.00 MiB 600.00 MiB +300.00 MiB "
        "900.00 MiB 1.17 GiB +300.00 MiB 1 1".split()
    )
    assert lines[5].split()[:4] == ["train.py", "main", "14", "-"]
    assert lines[7:] == ["... 4 more rows (--top 0 shows all)"]
    assert render_comparison(compare_files(*two_runs), top=6).splitlines()[-1] == (
        "... 1 more row (--top 0 shows all)"
    )


def test_cli_compare_prints_the_table(two_runs):
    done = cli("compare", str(two_runs[0]), str(two_runs[1]), "--top", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("A before: peak 912.00 MiB | B after: peak 1.24 GiB")
    assert done.stdout.count("train.py") == 7 and done.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("missing", "b.csv"), "gpu_mem_track: no such run or report: missing\n"),
        (("notes.txt", "b.csv"), "gpu_mem_track: notes.txt is not a gpu_mem_track report"),
        (
            ("b.csv", "b.csv", "--by", "line"),
            "gpu_mem_track: cannot compare by line: b.csv is a MemTracker CSV",
        ),
        ((".", "b.csv"), "gpu_mem_track: . is not a gpu_mem_track run folder"),
    ],
)
def test_cli_compare_mistakes_exit_2_with_one_line(tmp_path, args, message):
    (tmp_path / "notes.txt").write_text("hello\n")
    tracker_csv(tmp_path / "b.csv", [("a", 0.0, MIB)])
    done = cli("compare", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1
    assert done.stdout == ""


def test_cli_compare_rejects_a_corrupt_lines_csv_in_one_line(two_runs):
    lines = two_runs[0] / "lines.csv"
    header, first, *rest = lines.read_text().splitlines()
    assert header.split(",")[4] == "hits"
    cells = first.split(",")
    lines.write_text("\n".join([header, ",".join(cells[:4] + ["lots"] + cells[5:]), *rest]) + "\n")
    done = cli("compare", str(two_runs[0]), str(two_runs[1]))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("gpu_mem_track: not a valid report: ")
    assert done.stderr.endswith("lines.csv, line 2: not an integer: 'lots'\n")


@pytest.mark.parametrize(
    ("command", "options"),
    [("compare", ["--by", "--top"]), ("plot", ["--output", "--title", "matplotlib"])],
)
def test_compare_and_plot_have_help_for_every_option(command, options):
    done = cli(command, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m gpu_mem_track {command}")
    for option in options:
        assert option in done.stdout


def test_a_truncated_tracker_csv_is_rejected_naming_the_line(tmp_path):
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB), ("b", 1.0, 2 * MIB)])
    header, first, second = path.read_text().splitlines()
    path.write_text("\n".join([header, first, second[:20]]) + "\n")
    with pytest.raises(UsageError, match=r"t.csv, line 3: not a valid report row"):
        load_run(path)


def test_a_peak_that_is_a_lower_bound_shows_as_such(tmp_path):
    a = runner_folder(tmp_path, "a", [line("y = f(x)", 3, 10, 100, exact=False), line("z = g(y)", 4, 5, 90)])
    b = runner_folder(tmp_path, "b", [line("y = f(x)", 3, 10, 100), line("z = g(y)", 4, 5, 90)])
    by_line = render_comparison(compare_files(a, b)).splitlines()
    assert [row.split()[4:7] for row in by_line[4:]] == [["y", "=", "f(x)"], ["z", "=", "g(y)"]]
    assert ">=100.00 MiB" in by_line[4] and ">=" not in by_line[5]
    by_function = render_comparison(compare_files(a, b, by="function")).splitlines()
    assert ">=100.00 MiB  100.00 MiB" in by_function[4]


# -- files cut mid-row (a killed process) and runs that never wrote lines.csv --------------


def cut(path: Path, keep: int) -> str:
    """Cut ``path`` after its first ``keep`` characters of the last line, as a process
    killed mid-write leaves it (no line end); returns the line as it was."""
    text = path.read_text()
    head, last = text.rstrip("\n").rsplit("\n", 1)
    path.write_text(f"{head}\n{last[:keep]}")
    return last


@pytest.mark.parametrize(
    ("text", "rows", "cut_line"),
    [
        ("a,b\n1,2\n3,4\n", ["a,b\n", "1,2\n", "3,4\n"], 0),
        ("a,b\r\n1,2\r\n3,", ["a,b\r\n", "1,2\r\n"], 3),
        ('a,b\n1,"x\ny"\n3,"open\ncell', ["a,b\n", '1,"x\n', 'y"\n'], 4),  # a quoted newline
        ('a,b\n1,"say ""hi"""\n', ["a,b\n", '1,"say ""hi"""\n'], 0),
        ("", [], 0),
    ],
)
def test_complete_rows_hold_back_only_a_cut_last_row(text, rows, cut_line):
    import io

    complete = CompleteRows(io.StringIO(text, newline=""))
    assert list(complete) == rows
    assert complete.cut == text[len("".join(rows)) :] and complete.cut_line == cut_line


def test_a_tracker_csv_cut_mid_row_keeps_its_complete_stamps(tmp_path):
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB), ("b", 1.0, 2 * MIB), ("c", 2.0, 3 * MIB)])
    cut(path, 30)
    run = load_run(path)
    assert [(p.label, p.memory) for p in run.labels] == [("a", MIB), ("b", 2 * MIB)]
    assert run.notes == (
        f"{path}, line 4: the last row is incomplete (the writing process stopped mid-row); "
        "read the complete rows before it",
    )


def test_read_stamps_and_read_frame_leave_a_cut_row_out_and_say_so(tmp_path):
    from gpu_mem_track.tracker.csvlog import read_frame, read_stamps

    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB), ("b", 1.0, 2 * MIB)])
    cut(path, 12)
    notes: list[str] = []
    assert [s.label for s in read_stamps(path, notes)] == ["a"]
    assert list(read_frame(path, notes)["label"]) == ["a"]
    assert len(notes) == 2 and notes[0] == notes[1] and notes[0].startswith(f"{path}, line 3: ")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"^\S+empty.csv is not a gpu_mem_track CSV report \(it is empty\)$"):
        read_stamps(empty)


def test_a_lines_csv_cut_mid_row_leaves_the_partial_row_out(two_runs):
    path = two_runs[0] / "lines.csv"
    last = cut(path, 40)  # "/src/train.py,main,14,del out,1,95630131" (the memory cut short)
    assert last.startswith("/src/train.py,main,14,")
    run = load_run(two_runs[0])
    assert [r.line for r in run.lines] == [10, 11, 12, 13]
    assert len(run.notes) == 1 and run.notes[0].startswith(f"{path}, line 6: the last row is incomplete")


def test_a_timeline_cut_mid_row_leaves_the_partial_row_out(tmp_path):
    rows = [{"elapsed": 0.5 * i, "event": "line", "line": 3, "memory": (i + 1) * 100 * MIB} for i in range(3)]
    folder = runner_folder(tmp_path, "r", timeline=rows)
    cut(folder / "timeline.csv", 25)  # "3,1.0,line,,,3,,314572800" would read as 300 MiB
    run = load_run(folder, lines=False)
    assert [s.memory for s in run.samples] == [100 * MIB, 200 * MIB] and run.events == 2
    assert len(run.notes) == 1 and "line 4: the last row is incomplete" in run.notes[0]


def killed_run(tmp_path: Path, name: str = "killed") -> Path:
    """A run folder as SIGKILL leaves it: meta.json of a run still going, timeline.csv,
    no lines.csv; its script is in ``tmp_path`` so its code text can be read."""
    script = tmp_path / "train.py"
    script.write_text("model = build()\nfor step in range(2):\n    out = model(x)\n")
    where = {"event": "line", "file": str(script), "function": "main"}
    timeline = [
        {"elapsed": 0.0, "event": "start", "memory": 0},
        {**where, "elapsed": 0.1, "line": 1, "memory": 500 * MIB, "increment": 500 * MIB, "peak": 500 * MIB},
        {**where, "elapsed": 0.2, "line": 2, "memory": 500 * MIB, "increment": 0, "peak": 500 * MIB},
        {**where, "elapsed": 0.3, "line": 3, "memory": 800 * MIB, "increment": 300 * MIB, "peak": 900 * MIB},
        {**where, "elapsed": 0.4, "line": 2, "memory": 800 * MIB, "increment": 0, "peak": 800 * MIB},
        {**where, "elapsed": 0.5, "line": 3, "memory": 850 * MIB, "increment": 50 * MIB, "peak": 950 * MIB},
    ]
    folder = runner_folder(tmp_path, name, timeline=timeline)
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(ended=None, exit_code=None, peak=None, peak_at="")
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_a_run_without_lines_csv_is_compared_from_its_timeline(tmp_path, two_runs):
    killed = killed_run(tmp_path)
    comparison = compare_files(two_runs[0], killed)
    assert comparison.by == "line" and comparison.b.peak == 950 * MIB
    forward = by_code(comparison)[("out = model(x)", 1)]
    assert (forward.b.where, forward.b.value, forward.b.peak, forward.b.hits) == (
        "3",
        350 * MIB,
        950 * MIB,
        2,
    )
    assert forward.b.peak_exact is False  # the timeline does not say whether the mark moved
    assert forward.difference == 50 * MIB
    rebuilt = {r.line: r for r in comparison.b.lines}
    assert rebuilt[3].rise == 400 * MIB and rebuilt[3].memory == 850 * MIB  # 900 MiB over 500 at its start
    assert (rebuilt[2].hits, rebuilt[2].rise, rebuilt[2].code) == (2, 0, "for step in range(2):")
    (note,) = comparison.b.notes
    assert note.startswith(f"{killed} has no lines.csv (written when a run ends: this one was stopped")
    assert "per-line figures rebuilt from its timeline.csv" in note


def test_an_empty_lines_csv_counts_as_missing(tmp_path):
    killed = killed_run(tmp_path)
    (killed / "lines.csv").write_text("")  # stopped right after opening it
    run = load_run(killed)
    assert [r.line for r in run.lines] == [1, 2, 3]
    assert run.notes[0].startswith(f"{killed} has an empty lines.csv (the run was stopped while writing it);")


def test_cli_compare_on_a_killed_run_says_what_it_used(tmp_path, two_runs):
    killed = killed_run(tmp_path)
    done = cli("compare", str(two_runs[0]), str(killed), "--by", "function")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"gpu_mem_track: note: {killed} has no lines.csv")
    assert done.stderr.count("\n") == 1
    assert "train.py  main" in done.stdout and "nothing to compare" not in done.stdout


def test_nothing_to_compare_says_what_both_runs_lack(tmp_path):
    a = runner_folder(tmp_path, "a", timeline=[{"elapsed": 0.0, "event": "start", "memory": 0}])
    b = runner_folder(tmp_path, "b", timeline=[{"elapsed": 0.0, "event": "start", "memory": 0}])
    by_label = render_comparison(compare_files(a, b, by="label")).splitlines()[-1]
    assert (
        by_label
        == "(nothing to compare by label: neither run has track() stamps; --by line compares source lines)"
    )
    by_line = render_comparison(compare_files(a, b)).splitlines()[-1]
    assert by_line == "(nothing to compare by line: neither run has a traced line)"


def test_a_run_that_left_only_meta_json_is_named_with_what_is_missing(tmp_path, two_runs):
    empty = runner_folder(tmp_path, "empty")
    for by in (None, "label"):
        with pytest.raises(UsageError, match="empty has neither lines.csv nor timeline.csv"):
            compare_files(two_runs[0], empty, by=by)


def test_show_report_of_a_killed_run_names_its_peak_and_what_it_rebuilt(tmp_path):
    from gpu_mem_track.runs.show import show_report

    killed = killed_run(tmp_path)
    shown = show_report(killed)
    header = shown.text.splitlines()[:3]
    assert header[1].startswith("train.py did not end (killed, or still running) | device cuda:0")
    assert header[2].startswith(f"peak 950.00 MiB at {tmp_path / 'train.py'}:3 |")  # the line that allocated
    assert "out = model(x)" in shown.text and shown.notes[0].startswith(f"{killed} has no lines.csv")


def test_show_report_names_what_a_run_folder_lacks(tmp_path, two_runs):
    from gpu_mem_track.runs.show import show_report

    with pytest.raises(UsageError, match="empty has neither lines.csv nor timeline.csv: the run stopped"):
        show_report(runner_folder(tmp_path, "empty"))
    (two_runs[0] / "meta.json").unlink()
    with pytest.raises(
        UsageError, match="meta.json is missing, and show prints the run's description from it"
    ):
        show_report(two_runs[0] / "lines.csv")
    runs = tmp_path / "many"
    runner_folder(runs, "b")
    runner_folder(runs, "a")
    with pytest.raises(UsageError, match=f"^{runs} is a folder of 2 runs: give one, e.g. {runs / 'a'}$"):
        show_report(runs)
