"""Run folders as users hand them back: killed runs, damaged rows, long cells, bad
meta.json; every command reads them through the one guarded reader (issue 16, items 5,
6, 9 and 10): one line and exit 2, or the run shown with a note, never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from runfiles import MIB, line, runner_folder

COMMANDS = ("show", "compare", "plot", "html")


def run_command(in_process, command: str, folder: Path, tmp_path: Path):
    if command == "compare":
        return in_process("compare", folder, folder)
    if command == "plot":
        return in_process("plot", folder, "-o", tmp_path / "p.png")
    if command == "html":
        return in_process("html", folder, "-o", tmp_path / "p.html")
    return in_process(command, folder)


def one_line_exit_2(done, *expected: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


def folder_with_lines(tmp_path: Path) -> Path:
    return runner_folder(tmp_path, "r", [line("y = f(x)", 3, 10, 100), line("z = g(y)", 4, 5, 90)])


# -- item 10: meta.json of the wrong types, nested too deep ---------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"peak": "lots"}, "'peak' is 'lots', not int | None"),
        ({"peak": [1, 2]}, "'peak' is a list, not int | None"),
        ({"started": "Infinity"}, "'started' is 'Infinity', not float"),
        ({"argv": ["train.py", 3]}, "'argv' is a list, not tuple[str, ...]"),
        ({"run_name": None}, "'run_name' is None, not str"),
        ({"exit_code": 10**50}, "not JSON"),
    ],
)
@pytest.mark.parametrize("command", COMMANDS)
def test_meta_json_of_the_wrong_types_is_one_line(tmp_path, in_process, command, change, named):
    folder = folder_with_lines(tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(change)
    (folder / "meta.json").write_text(json.dumps(meta))
    one_line_exit_2(run_command(in_process, command, folder, tmp_path), "meta.json", named)
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "p.html").exists()


@pytest.mark.parametrize("text", ['{"peak": Infinity}', '{"peak": NaN}', '{"peak": 1e999}'])
def test_meta_json_non_finite_numbers_are_refused(tmp_path, in_process, text):
    folder = folder_with_lines(tmp_path)
    (folder / "meta.json").write_text(text)
    one_line_exit_2(in_process("show", folder), "meta.json: not JSON")


@pytest.mark.parametrize("command", COMMANDS)
def test_meta_json_nested_100k_deep_is_one_line(tmp_path, in_process, command):
    folder = folder_with_lines(tmp_path)
    (folder / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_exit_2(run_command(in_process, command, folder, tmp_path), "nested deeper than 32 levels")


# -- item 6: an all-empty row, a stray quote -------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_an_all_empty_row_in_lines_csv_is_named(tmp_path, in_process, command):
    folder = folder_with_lines(tmp_path)
    lines = (folder / "lines.csv").read_text().splitlines()
    width = lines[0].count(",")
    (folder / "lines.csv").write_text("\n".join([lines[0], lines[1], "," * width, lines[2]]) + "\n")
    if command in ("plot", "html"):  # they read the timeline, not lines.csv
        return
    done = run_command(in_process, command, folder, tmp_path)
    one_line_exit_2(done, "lines.csv, line 3: no value for 'line'")


def test_a_stray_quote_in_timeline_keeps_the_rows_after_it(tmp_path, in_process):
    rows = [{"elapsed": 0.1 * i, "event": "line", "line": 3, "memory": (i + 1) * MIB} for i in range(5)]
    rows[1].update(event="track", label="phase")
    folder = runner_folder(tmp_path, "r", timeline=rows)
    text = (folder / "timeline.csv").read_text().replace(",phase,", ',pha"se,')
    (folder / "timeline.csv").write_text(text)
    done = in_process("compare", folder, folder)
    assert done.returncode == 0, done.stderr
    assert "incomplete" not in done.stderr
    from gpu_mem_track.runs.load import load_run

    run = load_run(folder, lines=False)
    assert run.events == 5 and [p.label for p in run.labels] == ['pha"se'] and run.notes == ()


# -- item 5: killed runs, NaN and inf ------------------------------------------------------------


def killed(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text("model = build()\nout = model(x)\n")
    where = {"event": "line", "file": str(script), "function": "<module>"}
    timeline = [
        {"elapsed": 0.0, "event": "start", "memory": 0},
        {**where, "elapsed": 0.1, "line": 1, "memory": 500 * MIB, "increment": 500 * MIB, "peak": 500 * MIB},
        {**where, "elapsed": 0.2, "line": 2, "memory": 800 * MIB, "increment": 300 * MIB, "peak": 900 * MIB},
    ]
    folder = runner_folder(tmp_path, "killed", timeline=timeline)
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(ended=None, exit_code=None, peak=None, peak_at="")
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_html_of_a_killed_run_has_no_nan_and_says_what_is_missing(tmp_path, in_process):
    folder = killed(tmp_path)
    done = in_process("html", folder, "-o", tmp_path / "k.html")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "k.html").read_text()
    assert "NaN" not in page
    assert "no lines.csv" in done.stderr


def test_show_of_a_killed_run_names_the_peak_it_saw_and_what_is_missing(tmp_path, in_process):
    done = in_process("show", killed(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "peak unknown" not in done.stdout and "peak 900.00 MiB" in done.stdout
    assert "train.py did not end (killed, or still running)" in done.stdout
    assert "no lines.csv" in done.stderr


def test_a_run_killed_before_any_reading_says_why_its_peak_is_unknown(tmp_path, in_process):
    """os._exit or SIGKILL before the timeline's first flush: the header only."""
    folder = killed(tmp_path)
    header = (folder / "timeline.csv").read_text().splitlines()[0]
    (folder / "timeline.csv").write_text(header + "\n")
    done = in_process("show", folder)
    assert done.returncode == 0, done.stderr
    assert "peak unknown (no memory reading recorded)" in done.stdout
    assert "did not end (killed, or still running)" in done.stdout
    page = in_process("html", folder, "-o", tmp_path / "k.html")
    assert page.returncode == 0 and "no lines.csv" in page.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e300"])
@pytest.mark.parametrize("command", COMMANDS)
def test_nan_or_inf_elapsed_is_one_line(tmp_path, in_process, command, value):
    rows = [{"elapsed": 0.1 * i, "event": "line", "line": 3, "memory": (i + 1) * MIB} for i in range(3)]
    folder = runner_folder(tmp_path, "r", [line("y = f(x)", 3, 10, 100)], timeline=rows)
    text = (folder / "timeline.csv").read_text().splitlines()
    cells = text[2].split(",")
    cells[1] = value
    text[2] = ",".join(cells)
    (folder / "timeline.csv").write_text("\n".join(text) + "\n")
    done = run_command(in_process, command, folder, tmp_path)
    if command in ("show", "compare"):  # they read lines.csv only
        assert done.returncode == 0, done.stderr
        return
    one_line_exit_2(done, "timeline.csv, line 3: not a finite number")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_nan_seconds_in_lines_csv_is_one_line(tmp_path, in_process, value):
    folder = folder_with_lines(tmp_path)
    lines = (folder / "lines.csv").read_text().splitlines()
    lines[1] = lines[1].replace(",0.01", f",{value}")
    (folder / "lines.csv").write_text("\n".join(lines) + "\n")
    one_line_exit_2(in_process("show", folder), "lines.csv, line 2: not a finite number")


# -- item 9: what we write we read -----------------------------------------------------------


@pytest.mark.slow
def test_a_source_line_and_label_over_128_kib_round_trip(tmp_path):
    import subprocess

    long_text = "x" * (200 * 1024)
    script = tmp_path / "long.py"
    script.write_text(
        "from gpu_mem_track import MemTracker\n"
        f"s = '{long_text}'\n"
        "t = MemTracker(verbosity=0, probe=False, device='cpu')\n"
        "t.track('L' * 200 * 1024)\n"
    )
    out = tmp_path / "reports"
    env_run = [sys.executable, "-m", "gpu_mem_track"]
    done = subprocess.run(
        [*env_run, "run", "--out-dir", str(out), "--run-name", "long", str(script)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    folder = out / "long"
    for args in (["show", folder], ["compare", folder, folder], ["html", folder, "-o", tmp_path / "l.html"]):
        shown = subprocess.run([*env_run, *map(str, args)], capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0, shown.stderr
    assert long_text in (folder / "lines.csv").read_text()


def test_cells_over_128_kib_round_trip_in_lines_and_timeline(tmp_path, in_process):
    code = "y = '" + "x" * (200 * 1024) + "'"
    rows = [{"elapsed": 0.1, "event": "track", "label": "L" * (200 * 1024), "memory": MIB}]
    folder = runner_folder(tmp_path, "r", [line(code, 3, 10, 100)], timeline=rows)
    for command in COMMANDS:
        done = run_command(in_process, command, folder, tmp_path)
        assert done.returncode == 0, (command, done.stderr[-500:])
    from gpu_mem_track.runs.load import load_run

    run = load_run(folder)
    assert run.lines[0].code == code and run.labels[0].label == "L" * (200 * 1024)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_csv_that_is_not_utf8_is_one_line(tmp_path, in_process, command):
    rows = [{"elapsed": 0.1, "event": "line", "file": "/src/t.py", "line": 3, "memory": MIB}]
    folder = runner_folder(tmp_path, "r", [line("y = f(x)", 3, 10, 100)], timeline=rows)
    for name in ("lines.csv", "timeline.csv"):
        data = (folder / name).read_bytes().replace(b"/src/t", b"/src/\xff\xfe")
        (folder / name).write_bytes(data.replace(b"/src/train", b"/src/\xfftrain"))
    one_line_exit_2(run_command(in_process, command, folder, tmp_path), "is not a text report")
