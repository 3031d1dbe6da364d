"""The HTML side: the records' ``_repr_html_`` tables, the report's data and page, the
``html`` command and ``run --html``, and the page in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from runfiles import MIB, line, runner_folder, tracker_csv

from gpu_mem_track.errors import UsageError
from gpu_mem_track.html.data import collect, rank_folders
from gpu_mem_track.html.page import render_page, write_report
from gpu_mem_track.runs.compare import compare_files
from gpu_mem_track.runs.load import load_run
from gpu_mem_track.tracker.csvlog import append_stamp
from gpu_mem_track.tracker.records import GroupChange, Ledger, Stamp
from gpu_mem_track.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]


def stamp(label: str = "after forward", changes: tuple[GroupChange, ...] = ()) -> Stamp:
    ledger = Ledger(device="cpu", tensors=6 * MIB, rss=300 * MIB)
    return Stamp(3, 1.0e9, 2.5, "/src/train.py", 42, "main", label, ledger, changes)


def change(name: str, nbytes: int, count: int = 1) -> GroupChange:
    return GroupChange(
        "Tensor", (64, 1024), "torch.float32", "cpu", count, nbytes, count, max(nbytes, 0), (name,)
    )


def timeline_rows(values_mib: list[int], peaks_mib: list[int] | None = None) -> list[dict]:
    rows = [{"elapsed": 0.0, "event": "start", "file": "/src/train.py", "function": "<module>", "memory": 0}]
    for i, value in enumerate(values_mib):
        peak = (peaks_mib or values_mib)[i]
        rows.append(
            dict(
                elapsed=0.1 * (i + 1),
                event="line",
                file="/src/train.py",
                function="main",
                line=10 + i % 5,
                memory=value * MIB,
                increment=0,
                peak=peak * MIB,
            )
        )
    return rows


def two_lines() -> list:
    return [line("x = torch.randn(n)", 10, 4, 4), line("y = model(x)", 11, 8, 12, exact=False)]


# -- rich display: the records' tables ------------------------------------------------------


def test_a_stamp_renders_a_compact_table_and_escapes_what_the_user_wrote():
    html = stamp("<script>alert(1)</script>", (change("acts<1>", 256 * 1024),))._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "#3 train.py:42 main" in html
    assert "<td style='text-align:right'>6.00 MiB</td>" in html  # tensors
    assert "<td style='text-align:right'>300.00 MiB</td>" in html  # process RSS
    assert "acts&lt;1&gt;" in html and "+256.00 KiB" in html and "64x1024" in html


def test_repr_stays_one_line_of_text():
    text = repr(stamp())
    assert text.startswith("<Stamp #3 train.py:42 'after forward'") and "\n" not in text and "<td" not in text


def test_a_run_a_comparison_and_an_estimate_render_as_html(tmp_path):
    a = runner_folder(tmp_path, "a", two_lines(), peak=12 * MIB)
    b = runner_folder(tmp_path, "b", [line("x = torch.randn(n)", 10, 6, 6), line("y = model(x)", 11, 8, 14)])
    run_html = load_run(a)._repr_html_()
    assert "y = model(x)" in run_html and "&gt;=12.00 MiB" in run_html and "cuda:0" in run_html
    compared = compare_files(a, b)._repr_html_()
    assert "compared by line" in compared and "+2.00 MiB" in compared  # B-A of x's increment

    import torch

    from gpu_mem_track.estimator.simulate import estimate
    from gpu_mem_track.estimator.specs import InputSpec

    result = estimate(torch.nn.Linear(128, 64), [InputSpec((8, 128))], device="cuda:0")
    html = result._repr_html_()
    assert "Estimated training step of Linear" in html
    assert f"peak ({result.peak_phase.phase})" in html and "live at the peak" in html


# -- the report's data ----------------------------------------------------------------------


def test_collect_reads_a_runner_folder_its_censuses_and_ranks(tmp_path):
    folder = runner_folder(tmp_path, "run", two_lines(), timeline_rows([1, 3, 2], [1, 5, 2]), device="cpu")
    census = stamp("line 11 grew 4.00 MiB", (change("y", 4 * MIB),))
    append_stamp(folder / "census.csv", census)
    for rank in (1, 0):
        runner_folder(
            folder, f"rank{rank}", timeline=timeline_rows([rank + 1, rank + 2]), device=f"cuda:{rank}"
        )
    (folder / "rank_notes").mkdir()  # not a rank folder
    data = collect([folder])
    (run,) = data["runs"]
    assert run["name"] == "run" and run["memory_source"] == "process RSS"
    assert [r["code"] for r in run["lines"]] == ["x = torch.randn(n)", "y = model(x)"]
    # the transient peak of the second line is drawn before its end value, with its line
    assert [p[1] // MIB for p in run["points"]] == [0, 1, 5, 3, 2]
    assert run["points"][2][2] == "train.py:11 main (peak while it ran)"
    (only,) = run["censuses"]
    assert only["origin"] == "census" and only["changes"][0]["names"] == ["y"]
    assert collect([folder / "lines.csv"])["runs"][0]["censuses"] == run["censuses"]
    assert [r["rank"] for r in run["ranks"]] == [0, 1] and run["ranks"][1]["device"] == "cuda:1"
    assert data["comparison"] is None


def test_without_rank_folders_there_are_no_ranks(tmp_path):
    folder = runner_folder(tmp_path, "run", two_lines())
    assert rank_folders(folder) == [] and collect([folder])["runs"][0]["ranks"] == []


def test_a_launch_folder_shows_every_rank_not_rank_0_as_the_launch(tmp_path):
    root = tmp_path / "job"
    for rank, peak in ((0, 3), (1, 7)):
        folder = runner_folder(root, f"rank{rank}", two_lines(), timeline_rows([rank + 1]), peak=peak * MIB)
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        meta.update(rank=rank, world_size=3, exit_code=rank)  # rank 1 failed, rank 2 never started
        (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    (run,) = collect([root])["runs"]
    assert (run["name"], run["kind"], run["peak"], run["peak_rank"]) == ("job", "launch", 7 * MIB, 1)
    assert run["lines"] == [] and run["points"] == []  # nothing shown as the launch's own
    assert [(r["rank"], r["status"], r["peak"], r["difference"]) for r in run["ranks"]] == [
        (0, "ok", 3 * MIB, 0),
        (1, "exit 1", 7 * MIB, 4 * MIB),
        (2, "missing", None, None),
    ]
    assert [len(r["lines"]) for r in run["ranks"]] == [2, 2, 0] and run["ranks"][1]["points"]
    assert run["ranks"][0]["peak_at"] == "train.py:1" and run["status"] == "exit 1, missing, ok"
    assert run["launch"]["spread_text"] == "2.333 (rank 1 / rank 0)"


def test_a_launch_whose_ranks_peak_alike_says_so_not_rank_0_over_rank_0(tmp_path):
    for rank in (0, 1):
        runner_folder(tmp_path / "job", f"rank{rank}", two_lines(), timeline_rows([1]), peak=5 * MIB)
    (run,) = collect([tmp_path / "job"])["runs"]
    assert run["launch"]["spread_text"] == "1.000 (every rank's peak is equal)"


def test_a_launch_with_a_killed_rank_renders_what_that_rank_left(tmp_path):
    for rank in (0, 1):
        runner_folder(tmp_path / "job", f"rank{rank}", two_lines(), timeline_rows([1, 4, 2]), peak=5 * MIB)
    (tmp_path / "job" / "rank1" / "lines.csv").unlink()  # killed: only its timeline is left
    page = write_report([tmp_path / "job"], tmp_path / "launch.html")
    assert page.is_file()
    data = collect([tmp_path / "job"])
    json.dumps(data, allow_nan=False)  # the page's data: no NaN or inf for the browser to choke on
    (run,) = data["runs"]
    rank1 = run["ranks"][1]
    assert rank1["lines"] and all(line["seconds"] is None for line in rank1["lines"])


def test_long_timelines_are_cut_keeping_every_bucket_s_highest_value(tmp_path):
    values = [(i * 7919) % 1000 for i in range(5000)]
    values[3333] = 5000
    folder = runner_folder(tmp_path, "long", timeline=timeline_rows(values), device="cpu")
    points = collect([folder], points=100)["runs"][0]["points"]
    assert len(points) <= 200
    assert max(p[1] for p in points) == 5000 * MIB
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_two_runs_are_compared_by_line_or_by_label(tmp_path):
    a = runner_folder(tmp_path, "a", two_lines())
    b = runner_folder(tmp_path, "b", [line("x = torch.randn(n)", 10, 6, 6), line("y = model(x)", 11, 8, 14)])
    comparison = collect([a, b])["comparison"]
    assert comparison["by"] == "line" and comparison["rows"][0]["difference"] == 2 * MIB
    ta = tracker_csv(tmp_path / "a.csv", [("step", 1.0, 10 * MIB)])
    tb = tracker_csv(tmp_path / "b.csv", [("step", 1.0, 13 * MIB)])
    data = collect([ta, tb])
    assert data["comparison"]["by"] == "label" and data["comparison"]["rows"][0]["difference"] == 3 * MIB
    assert [p[1] for p in data["runs"][0]["points"]] == [10 * MIB]
    assert data["runs"][0]["labels"][0][2] == "step"


def test_runs_that_cannot_be_compared_get_a_note_not_an_error(tmp_path):
    lines_only = runner_folder(tmp_path, "a", two_lines())
    labels_only = tracker_csv(tmp_path / "b.csv", [("step", 1.0, MIB)])
    data = collect([lines_only, labels_only])
    assert data["comparison"] is None and data["notes"][0].startswith("no comparison: ")


def test_a_memory_snapshot_is_analysed_as_the_snapshot_command_does(tmp_path):
    from snapshotfiles import write
    from test_snapshot_report import training_data

    from gpu_mem_track.snapshots.folder import load_checked, report_folder

    snap = write(tmp_path / "step.pickle.gz", training_data(), compress=True)
    (run,) = collect([snap])["runs"]
    folder, analysis = report_folder(load_checked(snap), tmp_path / "out")
    assert run["path"] == str(snap) and run["peak"] == analysis.peak.allocated
    assert run["kind"] == "snapshot"
    own = ("phase", "live_at_peak", "first", "last")
    assert [{k: v for k, v in r.items() if k not in own} for r in run["lines"]] == [
        r.to_dict() for r in load_run(folder).lines
    ]
    usage = {(u.file, u.line): u for u in analysis.lines}
    for record in run["lines"]:
        assert record["phase"] == usage[record["file"], record["line"]].category
        assert record["live_at_peak"] == usage[record["file"], record["line"]].live_at_peak
    timed = [r for r in run["lines"] if r["first"] is not None]
    assert timed and any(r["last"] > 0 for r in timed)  # times from the trace, not all 0
    assert all(0 <= r["first"] <= r["last"] for r in timed)
    assert run["reserved"] and max(p[1] for p in run["reserved"]) == analysis.max_reserved
    rows = dict(run["snapshot"]["rows"])
    assert rows["peak allocated"].startswith(format_bytes(analysis.peak.allocated))
    assert rows["cache at the peak"].startswith(format_bytes(analysis.cache_at_peak))
    assert rows["largest free block"].startswith(format_bytes(analysis.largest_free))
    assert [p[0] for p in run["snapshot"]["phases"]] == [c.name for c in analysis.categories]
    assert not list(Path(tempfile.gettempdir()).glob("gpu_mem_track-html-*"))  # nothing left behind


def test_bad_snapshots_and_missing_inputs_are_one_line_usage_errors(tmp_path):
    pickle = tmp_path / "snap.pickle"
    pickle.write_bytes(b"\x80\x04N.")
    with pytest.raises(UsageError, match="not a memory snapshot"):
        collect([pickle])
    with pytest.raises(UsageError, match="no such run"):
        collect([tmp_path / "missing"])
    with pytest.raises(UsageError):
        collect([])


# -- the page -------------------------------------------------------------------------------


def test_the_page_is_self_contained_and_its_data_cannot_close_the_script(tmp_path):
    evil = line("s = '</script><script>alert(1)</script>'", 12, 1, 1)
    folder = runner_folder(tmp_path, "run", [*two_lines(), evil], timeline_rows([1, 2]))
    page = render_page(collect([folder]))
    assert page.count("</script>") == 2  # the data's and the code's own
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page)  # nothing fetched
    payload = re.search(r"<script type='application/json' id='gmt-data'>(.*?)</script>", page, re.S)
    data = json.loads(payload.group(1))
    assert data["runs"][0]["lines"][2]["code"] == "s = '</script><script>alert(1)</script>'"


def test_the_html_command_writes_the_page_and_reports_mistakes(tmp_path, in_process):
    folder = runner_folder(tmp_path, "run", two_lines(), timeline_rows([1, 2]))
    out = tmp_path / "page.html"
    done = in_process("html", folder, "-o", out)
    assert (done.returncode, done.stderr) == (0, f"Wrote {out}\n")
    assert "y = model(x)" in out.read_text(encoding="utf-8")
    missing = in_process("html", tmp_path / "nope", "-o", out)
    assert (missing.returncode, missing.stderr) == (
        2,
        f"gpu_mem_track: no such run or report: {tmp_path / 'nope'}\n",
    )
    bad = in_process("html", folder, "--points", "0")
    assert bad.returncode == 2 and "--points" in bad.stderr


def test_run_html_writes_report_html_into_the_run_folder(tmp_path, in_process):
    script = tmp_path / "script.py"
    script.write_text("a = [0] * 100000\nb = len(a)\n", encoding="utf-8")
    done = in_process("run", "--out-dir", tmp_path / "reports", "--run-name", "r", "--html", script)
    assert done.returncode == 0
    page = tmp_path / "reports" / "r" / "report.html"
    assert "a = [0] * 100000" in page.read_text(encoding="utf-8")
    assert done.stderr.endswith(f"Wrote {page}\n")  # the summary's Reports: line lists no page


# -- a real browser -------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(page: Path, fragment: str = "") -> tuple[str, str]:
    """The DOM after the page's scripts ran, and Chromium's log (console messages)."""
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def body_attributes(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'([\w-]+)="([^"]*)"', body))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_the_page_runs_without_errors_and_its_table_sorts_in_chromium(tmp_path):
    lines = [line(f"v{i} = f({i})", 10 + i, (i * 5) % 7, (i * 3) % 11 + 1) for i in range(8)]
    a = runner_folder(tmp_path, "a", lines, timeline_rows([1, 4, 2, 8, 3]))
    b = runner_folder(tmp_path, "b", lines[:5], timeline_rows([2, 3, 5]))
    append_stamp(a / "census.csv", stamp("line 12 grew", (change("v2", 4 * MIB),)))
    runner_folder(a, "rank1", lines[:2], timeline=timeline_rows([1, 2]))
    page = write_report([a, b], tmp_path / "report.html")
    dom, log = dump_dom(page, "#selftest")
    body = body_attributes(dom)
    assert body.get("data-status") == "ready", body
    assert "data-errors" not in body, body["data-errors"]
    assert "CONSOLE" not in log and "Uncaught" not in log
    assert body["data-selftest"] == "sort-desc:ok sort-asc:ok peak:ok zoom:ok span:ok hover:ok"
    peaks = [int(v) for v in body["data-sorted-peaks"].split(",")]
    assert peaks == sorted(r.peak for r in lines)  # ascending after the second click
    for section in ("gmt-timeline", "gmt-line-section", "gmt-comparison", "gmt-ranks", "gmt-censuses"):
        assert f'id="{section}"' in dom
    # the ranks before the timeline, the comparison before the long line table
    assert dom.index('id="gmt-ranks"') < dom.index('id="gmt-timeline"') < dom.index('id="gmt-comparison"')
    assert dom.index('id="gmt-comparison"') < dom.index('id="gmt-line-section"')
    # round tick values, and each run's peak labelled on the chart
    ticks = re.findall(r'<text[^>]*class="axis"[^>]*>([^<]*)</text>', dom)
    assert "0 MiB" in ticks and "2 MiB" in ticks and "0.0 s" in ticks
    assert re.findall(r'class="peak-label"[^>]*>(peak [^<]*)<', dom) == [
        "peak 8.00 MiB",
        "peak 2.00 MiB",
        "peak 5.00 MiB",
    ]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_a_launch_page_keys_every_rank_and_a_stamp_is_labelled(tmp_path):
    root = tmp_path / "job"
    rows = timeline_rows([1, 4, 2])
    rows.insert(2, {"elapsed": 0.15, "event": "track", "label": "after forward", "memory": 1 * MIB})
    for rank, peak in ((0, 4), (1, 9)):
        runner_folder(root, f"rank{rank}", two_lines(), rows, peak=peak * MIB)
    dom, _ = dump_dom(write_report([root], tmp_path / "launch.html"), "#selftest")
    body = body_attributes(dom)
    assert (body.get("data-status"), body.get("data-errors")) == ("ready", None)
    assert "span:ok" in body["data-selftest"]
    runs = re.search(r'id="gmt-runs".*?</table>', dom, re.S).group(0)
    assert "9.00 MiB (rank 1)" in runs and "launch of 2 ranks" in runs
    ranks = re.search(r'id="gmt-rank-table".*?</table>', dom, re.S).group(0)
    assert "<th>points</th>" not in ranks and "<th>status</th>" in ranks and "+5.00 MiB" in ranks
    assert "Spread: largest peak / smallest = 2.250 (rank 1 / rank 0)" in dom
    key = re.search(r'<div class="key">.*?</div>', dom, re.S).group(0)
    assert "rank 0" in key and "rank 1" in key
    assert re.search(r'class="stamp"[^>]*>after forward<', dom)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_a_snapshot_page_shows_the_allocator_summary_and_the_trace_s_times(tmp_path):
    from snapshotfiles import write
    from test_snapshot_report import training_data

    snap = write(tmp_path / "step.pickle.gz", training_data(), compress=True)
    dom, _ = dump_dom(write_report([snap], tmp_path / "snap.html"), "#selftest")
    body = body_attributes(dom)
    assert (body.get("data-status"), body.get("data-errors")) == ("ready", None)
    assert "<td>snapshot</td>" in dom and "cache at the peak" in dom and "<th>phase</th>" in dom
    assert ">first s</th>" in dom and "dashed: reserved" in dom
    assert dom.count('class="series reserved"') == 1


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_a_page_without_timeline_or_ranks_renders_and_a_script_error_is_caught_into_the_dom(tmp_path):
    folder = runner_folder(tmp_path, "run", two_lines())
    dom, log = dump_dom(write_report([folder], tmp_path / "plain.html"), "#selftest")
    body = body_attributes(dom)
    assert (body.get("data-status"), body.get("data-errors")) == ("ready", None)
    assert body["data-selftest"] == "sort-desc:ok sort-asc:ok" and 'id="gmt-timeline"' not in dom
    page = tmp_path / "broken.html"
    text = render_page(collect([folder])).replace(
        "function main() {", "function main() { undefinedName();", 1
    )
    page.write_text(text, encoding="utf-8")
    body = body_attributes(dump_dom(page)[0])
    assert "undefinedName" in body.get("data-errors", "") and body.get("data-status") == "loading"
