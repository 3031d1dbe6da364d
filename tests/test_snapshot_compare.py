"""``snapshot A --compare B``: two snapshots compared line by line and phase by phase, on
hand-built snapshots (exact text), end to end in a subprocess, in the HTML page's data,
and on the real traces recorded on GPUs (skipped when absent)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import snapshotfiles as sf

from gpu_mem_track.allocator.replay import replay
from gpu_mem_track.errors import UsageError
from gpu_mem_track.html.data import collect
from gpu_mem_track.snapshotfile import load_snapshot, snapshot_from_data
from gpu_mem_track.snapshots.analyse import analyse
from gpu_mem_track.snapshots.attribution import Attributor
from gpu_mem_track.snapshots.compare import compare_analyses, match_files, size_differences
from gpu_mem_track.snapshots.compare_report import render_comparison, write_lines_csv, write_sizes_csv

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
BASE = sf.BASE
MODULE = {"filename": "/opt/env/lib/python3.12/site-packages/torch/nn/modules/module.py", "line": 1750,
          "name": "_call_impl"}  # fmt: skip
H200 = sf.FIXTURES.parent / "h200" if sf.FIXTURES is not None else None


def at(filename: str, line: int, name: str = "main", forward: bool = False) -> list[dict]:
    """A Python-only stack (``stacks="python"``): the frame, under a module call if ``forward``."""
    frame = {"filename": filename, "line": line, "name": name}
    return [frame, MODULE, {"filename": "/x/run.py", "line": 1, "name": "<module>"}] if forward else [frame]


def build(allocations: list[tuple[list[dict], int]]) -> dict:
    """One 2 MiB small segment and the allocations (stack, request bytes) side by side in
    it, none freed: its end state follows by hand."""
    trace = [sf.entry("segment_alloc", BASE, 2 * MIB, 1)]
    blocks, address = [], BASE
    for k, (frames, request) in enumerate(allocations):
        trace.append(dict(sf.entry("alloc", address, request, 2 + k), frames=frames))
        size = -(-request // 512) * 512
        blocks.append((size, request, "active_allocated"))
        address += size
    blocks.append((BASE + 2 * MIB - address, 0, "inactive"))
    return sf.snapshot([sf.segment(BASE, blocks, "small")], trace)


A = build(
    [
        (at("/home/me/proj/train.py", 10), 400),
        (at("/home/me/proj/models/net.py", 5, "forward", forward=True), 1000),
        (at("/home/me/proj/utils/net.py", 7, "helper"), 1000),
        ([], 4096),
    ]
)
B = build(
    [
        (at("train.py", 10), 400),
        (at("/srv/x/models/net.py", 5, "forward", forward=True), 2000),
        (at("/srv/x/models/net.py", 5, "forward", forward=True), 2000),
        (at("train.py", 11), 600),
        ([], 4096),
    ]
)


def analysed(data: dict, name: str) -> dict:
    snapshot = snapshot_from_data(data, name)
    return analyse(snapshot, replay(snapshot, 0), Attributor()).to_dict()


def compared():
    return compare_analyses(analysed(A, "a.pickle"), analysed(B, "b.pickle"), "a", "b")


def test_files_match_by_name_then_by_the_folders_their_paths_share():
    files = match_files(
        [
            "/home/me/proj/train.py",
            "/home/me/proj/models/net.py",
            "/home/me/proj/utils/net.py",
            "<no frames>",
        ],
        ["train.py", "/srv/x/models/net.py", "/srv/x/other/net.py", "<no frames>", "<backward>"],
    )
    assert files == {
        "/home/me/proj/train.py": "train.py",
        "/home/me/proj/models/net.py": "/srv/x/models/net.py",
        "/home/me/proj/utils/net.py": "/srv/x/other/net.py",  # the one net.py left, by name
        "<no frames>": "<no frames>",
    }


def test_size_differences_keep_counts_that_differ_largest_bytes_first():
    out = size_differences(Counter({1000: 1, 512: 3, 64: 2}), Counter({2000: 2, 512: 3, 64: 1}))
    assert [(d.size, d.count_a, d.count_b, d.bytes) for d in out] == [
        (2000, 0, 2, 4000),
        (1000, 1, 0, -1000),
        (64, 2, 1, -64),
    ]


def test_the_comparison_of_hand_built_snapshots():
    c = compared()
    rows = [(u.where, u.allocated_a, u.allocated_b, u.at_peak_a, u.at_peak_b, u.difference) for u in c.lines]
    assert rows == [
        ("models/net.py:5 forward", 1024, 4096, 1024, 4096, 3072),
        ("train.py:11 main", 0, 1024, 0, 1024, 1024),
        ("utils/net.py:7 helper", 1024, 0, 1024, 0, 1024),
        ("<no frames>", 4096, 4096, 4096, 4096, 0),
        ("train.py:10 main", 512, 512, 512, 512, 0),
    ]
    assert (c.matched, c.peak_a, c.peak_b) == (3, 6656, 9728)
    assert [(p.name, p.allocated_a, p.allocated_b) for p in c.phases] == [
        ("forward", 1024, 4096),
        ("other", 5632, 5632),
    ]
    other = c.phases[1]
    assert [(s.size, s.count_a, s.count_b) for s in other.sizes] == [(1000, 1, 0), (600, 0, 1)]
    assert json.loads(json.dumps(c.to_dict()))["lines"][0]["sizes"] == [
        {"size": 2000, "count_a": 0, "count_b": 2},
        {"size": 1000, "count_a": 1, "count_b": 0},
    ]


def test_the_text_report_of_hand_built_snapshots():
    text = render_comparison(compared(), top=3)
    assert text == (
        "gpu_mem_track snapshot comparison: B minus A\n"
        "A: a (a.pickle; trace of 5 entries)\n"
        "B: b (b.pickle; trace of 6 entries)\n"
        "Lines are matched by file, line number and function; files by name, and where names repeat by "
        "the most\ntrailing folders their paths share (a path recorded elsewhere still matches).\n"
        "3 of 5 lines in both. Sizes A/B: a request size, then how many allocations of it each made.\n"
        "\n"
        "                                 A             B         B - A\n"
        "peak allocated            6.50 KiB      9.50 KiB     +3.00 KiB\n"
        "highest reserved          2.00 MiB      2.00 MiB          +0 B\n"
        "allocated at the end      6.50 KiB      9.50 KiB     +3.00 KiB\n"
        "\n"
        "Phases\n"
        "======\n"
        " Allocated A   Allocated B         B - A     At peak A     At peak B         B - A  Phase\n"
        "    1.00 KiB      4.00 KiB     +3.00 KiB      1.00 KiB      4.00 KiB     +3.00 KiB  forward\n"
        "              sizes A/B: 1.95 KiB 0/2, 1000 B 1/0\n"
        "    5.50 KiB      5.50 KiB          +0 B      5.50 KiB      5.50 KiB          +0 B  other\n"
        "              sizes A/B: 1000 B 1/0, 600 B 0/1\n"
        "\n"
        "Lines, largest difference first (top 3 of 5)\n"
        "============================================\n"
        " Allocated A   Allocated B         B - A     At peak A     At peak B         B - A  Where\n"
        "    1.00 KiB      4.00 KiB     +3.00 KiB      1.00 KiB      4.00 KiB     +3.00 KiB  "
        "models/net.py:5 forward\n"
        "              sizes A/B: 1.95 KiB 0/2, 1000 B 1/0\n"
        "         0 B      1.00 KiB     +1.00 KiB           0 B      1.00 KiB     +1.00 KiB  "
        "train.py:11 main (only in B)\n"
        "              sizes A/B: 600 B 0/1\n"
        "    1.00 KiB           0 B     -1.00 KiB      1.00 KiB           0 B     -1.00 KiB  "
        "utils/net.py:7 helper (only in A)\n"
        "              sizes A/B: 1000 B 1/0\n"
    )


def test_the_csv_files_of_hand_built_snapshots():
    c = compared()
    lines, sizes = io.StringIO(), io.StringIO()
    write_lines_csv(lines, c)
    write_sizes_csv(sizes, c)
    rows = list(csv.DictReader(io.StringIO(lines.getvalue())))
    assert [
        (r["where"], r["file_a"], r["file_b"], r["allocated_difference"], r["difference"]) for r in rows
    ] == [
        ("models/net.py:5 forward", "/home/me/proj/models/net.py", "/srv/x/models/net.py", "3072", "3072"),
        ("train.py:11 main", "", "train.py", "1024", "1024"),
        ("utils/net.py:7 helper", "/home/me/proj/utils/net.py", "", "-1024", "1024"),
        ("<no frames>", "<no frames>", "<no frames>", "0", "0"),
        ("train.py:10 main", "/home/me/proj/train.py", "train.py", "0", "0"),
    ]
    assert sizes.getvalue().splitlines() == [
        "scope,where,size,count_a,count_b,bytes",
        "line,models/net.py:5 forward,2000,0,2,4000",
        "line,models/net.py:5 forward,1000,1,0,-1000",
        "line,train.py:11 main,600,0,1,600",
        "line,utils/net.py:7 helper,1000,1,0,-1000",
        "phase,forward,2000,0,2,4000",
        "phase,forward,1000,1,0,-1000",
        "phase,other,1000,1,0,-1000",
        "phase,other,600,0,1,600",
    ]


def test_a_file_both_record_at_one_path_keeps_it_whole_on_every_line():
    # two runs on one machine: the same absolute paths; line 5 moved to line 6 in B
    a = build([(at("/w/proj/net.py", 5, "forward"), 1000), (at("/w/proj/train.py", 3), 400)])
    b = build([(at("/w/proj/net.py", 6, "forward"), 1000), (at("/w/proj/train.py", 3), 400)])
    c = compare_analyses(analysed(a, "a.pickle"), analysed(b, "b.pickle"))
    assert sorted(u.where for u in c.lines) == [
        "/w/proj/net.py:5 forward",  # only in A
        "/w/proj/net.py:6 forward",  # only in B: named as A names the file
        "/w/proj/train.py:3 main",
    ]


def test_a_trace_without_frames_and_a_snapshot_without_a_trace_compare():
    frameless = build([([], 4096), ([], 1000)])
    no_trace = dict(frameless, device_traces=[[]])  # the same blocks, recorded with a stack each
    c = compare_analyses(analysed(frameless, "f.pickle"), analysed(no_trace, "n.pickle"))
    where = {u.where: (u.allocated_a, u.allocated_b, u.hits_a, u.hits_b) for u in c.lines}
    # without a trace, B's figures are its blocks in use, and its lines the blocks' stacks
    assert where == {"<no frames>": (5120, 0, 2, 0), "train.py:12 step": (0, 5120, 0, 2)}
    assert (c.entries_a, c.entries_b, c.matched, c.peak_a, c.peak_b) == (3, 0, 0, 5120, 5120)
    (phase,) = c.phases
    assert (phase.name, phase.sizes) == ("other", ())  # the same requests: 4096 and 1000 B


def test_what_is_not_an_analysis_is_a_usage_error():
    with pytest.raises(UsageError, match="not a snapshot analysis"):
        compare_analyses({"lines": []}, analysed(A, "a.pickle"))


def test_the_html_page_data_holds_the_comparison_of_two_snapshots(tmp_path):
    a = sf.write(tmp_path / "a.pickle", A)
    b = sf.write(tmp_path / "b.pickle.gz", B, compress=True)
    data = collect([a, b])
    c = data["snapshot_comparison"]
    assert (c["a"], c["b"], c["matched"], c["total"]) == ("a", "b", 3, 5)
    assert c["lines"][0] == [
        "models/net.py:5 forward", "forward", "1.00 KiB", "4.00 KiB", "+3.00 KiB", "1.00 KiB", "4.00 KiB",
        "+3.00 KiB", "1.95 KiB 0/2, 1000 B 1/0",
    ]  # fmt: skip
    assert c["peaks"][0] == ["peak allocated", "6.50 KiB", "9.50 KiB", "+3.00 KiB"]
    assert all("analysis" not in run for run in data["runs"])  # not embedded whole
    assert collect([a])["snapshot_comparison"] is None


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", "snapshot", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_command_writes_and_prints_the_comparison(tmp_path):
    sf.write(tmp_path / "a.pickle", A)
    sf.write(tmp_path / "b.pickle", B)
    done = cli("a.pickle", "--compare", "b.pickle", "--top", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu_mem_track snapshot comparison: B minus A\nA: a (")
    assert "Lines, largest difference first (top 2 of 5)" in done.stdout
    assert "Reports: reports/a-vs-b/ (compare.txt, compare_lines.csv" in done.stdout.replace(os.sep, "/")
    folder = tmp_path / "reports" / "a-vs-b"
    assert (folder / "compare.txt").read_text() == done.stdout[: done.stdout.index("Reports:")]
    assert json.loads((folder / "compare.json").read_text())["format"] == "gpu_mem_track snapshot comparison"
    assert '"snapshot_comparison":{"a":"a","b":"b"' in (folder / "compare.html").read_text()
    assert (tmp_path / "reports" / "a" / "snapshot.json").is_file()
    assert (tmp_path / "reports" / "b" / "report.txt").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("a.pickle", "--compare", "missing.pickle"), "no such snapshot: missing.pickle"),
        (
            ("a.pickle", "b.pickle", "--compare", "b.pickle"),
            "--compare compares one FILE with b.pickle; 2 were",
        ),
        (("a.pickle", "--compare", "notes.txt"), "notes.txt"),
        (("a.pickle", "--compare", "b.pickle", "--device", "3"), "a.pickle: no device 3 in the snapshot"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    sf.write(tmp_path / "a.pickle", A)
    sf.write(tmp_path / "b.pickle", B)
    (tmp_path / "notes.txt").write_text("not a snapshot\n")
    done = cli(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr
    assert not (tmp_path / "reports").exists()  # nothing written before every file was read


# -- the real traces -----------------------------------------------------------------------


@pytest.mark.skipif(H200 is None or not (H200 / "nanogpt-char.pickle.gz").is_file(), reason="no H200 traces")
def test_a_real_trace_compared_with_itself_differs_nowhere():
    analysis = analysed_file(H200 / "nanogpt-char.pickle.gz")
    c = compare_analyses(analysis, analysis)
    assert c.matched == len(c.lines) == len(analysis["lines"])
    assert all(u.difference == 0 and not u.sizes for u in c.lines)
    assert all(not p.sizes and p.allocated_a == p.allocated_b for p in c.phases)


@pytest.mark.skipif(
    H200 is None or not (H200 / "nanogpt-gpt2-bf16.pickle.gz").is_file(), reason="no H200 traces"
)
def test_two_real_nanogpt_configurations_match_their_lines():
    """Both ran nanoGPT's train.py and model.py from other folders: every line but one
    (model.py:91, which only one configuration runs) is in both."""
    a = analysed_file(H200 / "nanogpt-char.pickle.gz")
    b = analysed_file(H200 / "nanogpt-gpt2-bf16.pickle.gz")
    c = compare_analyses(a, b)
    assert c.peak_b - c.peak_a == 13_872_012_800 - 1_768_961_024
    top = c.lines[0]
    # backward's allocations, frameless, are charged to the line that called backward
    assert (top.where, top.allocated_a, top.allocated_b) == (
        "train.py:305 <module>",
        32_669_185_024,
        301_640_437_248,
    )
    assert (top.hits_a, top.hits_b, top.phase_a, top.phase_b) == (2562, 8161, "backward", "backward")
    assert {u.where for u in c.lines if u.file_a and u.file_b} >= {
        "model.py:187 forward",
        "train.py:305 <module>",
    }
    assert c.matched == len(c.lines) - 1
    assert [u.where for u in c.lines if not (u.file_a and u.file_b)] == ["model.py:91 forward"]


@pytest.mark.skipif(sf.FIXTURES is None, reason="../shared/fixtures/snapshots not present")
def test_real_traces_with_cpp_frames_and_a_snapshot_without_a_trace_compare():
    step = analysed_file(sf.FIXTURES / "transformer-2.7b-ctx128-train-step.pickle.gz")
    forward = analysed_file(sf.FIXTURES / "transformer-2.7b-ctx128-forward-amp.pickle.gz")
    c = compare_analyses(step, forward)
    assert c.matched > 0 and {p.name for p in c.phases} >= {"forward", "backward", "optimizer"}
    backward = next(p for p in c.phases if p.name == "backward")
    assert backward.allocated_b == 0 and backward.allocated_a > 0
    blocks = analysed_file(sf.FIXTURES / "segments-only.pickle.gz")
    c = compare_analyses(step, blocks)
    assert c.entries_b == 0 and c.final_allocated_b == blocks["final_allocated"]


def analysed_file(path: Path) -> dict:
    snapshot = load_snapshot(path)
    device = next((d for d, t in enumerate(snapshot.device_traces) if t), 0)
    return analyse(snapshot, replay(snapshot, device), Attributor()).to_dict()


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("chromium") or shutil.which("chromium-browser")),
    reason="needs chromium (apt-get install chromium)",
)
def test_the_page_of_two_snapshots_shows_their_comparison_in_chromium(tmp_path):
    from test_html import body_attributes, dump_dom

    from gpu_mem_track.html.page import write_report

    a = sf.write(tmp_path / "a.pickle", A)
    b = sf.write(tmp_path / "b.pickle", B)
    dom, log = dump_dom(write_report([a, b], tmp_path / "page.html"))
    body = body_attributes(dom)
    assert (body.get("data-status"), body.get("data-errors")) == ("ready", None)
    section = re.search(r'id="gmt-snapshot-comparison".*?</section>', dom, re.S).group(0)
    assert "Snapshots compared: B (b) minus A (a)" in section and "3 of 5 lines in both" in section
    assert "<td>models/net.py:5 forward</td>" in section and "1.95 KiB 0/2, 1000 B 1/0" in section
