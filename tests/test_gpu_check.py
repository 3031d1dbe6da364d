"""scripts/gpu/gpu_check.py: what it reads from runs, its tables, its clock (slots, interrupts,
a report rewritten after every step), its registry of workloads, the edge claims' call, and
its dry mode end to end (a subprocess, on the convnet example only)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "gpu"
MIB = 2**20


def _load(name: str):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_iteration_times_are_read_as_nanogpt_prints_them():
    report = _load("gpu_check_report")
    output = (
        "step 0: train loss 4.2, val loss 4.2\n"
        "iter 0: loss 4.2087, time 1199.43ms, mfu -100.00%\n"
        "iter 1: loss 4.1000, time 14.20ms, mfu -100.00%\n"
        "noise iter 9: loss 1, time 5ms\n"
        "iter 2: loss nan, time 13.5 ms\n"
    )
    assert report.iteration_times(output) == [1199.43, 14.2, 13.5]
    assert report.median_after_warmup([100.0, 5.0, 3.0, 4.0], 1) == 4.0
    assert report.median_after_warmup([100.0, 5.0, 3.0], 1) is None


def test_pytest_summary_is_its_closing_line():
    report = _load("gpu_check_report")
    end = "==== 10 failed, 991 passed, 13 skipped in 147.67s (0:02:27) ====\n"
    text = "....F\nFAILED tests/test_a.py::test_b - x\n" + end
    assert report.pytest_summary(text) == "10 failed, 991 passed, 13 skipped in 147.67s (0:02:27)"
    assert report.pytest_summary("nothing ran\n") == ""


def test_junit_xml_gives_the_counts_and_the_failed_tests():
    report = _load("gpu_check_report")
    # As an interrupted pytest writes it: the case it was in has no name.
    xml = (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        '<testsuite name="pytest" errors="1" failures="1" skipped="2" tests="7" time="12.5">'
        '<testcase classname="tests.test_a" name="test_ok" time="0.1" />'
        '<testcase classname="tests.test_a" name="test_bad"><failure message="x">x</failure></testcase>'
        '<testcase classname="tests.test_b" name="test_setup"><error message="y">y</error></testcase>'
        '<testcase time="0.000" /></testsuite></testsuites>'
    )
    counts = report.junit_counts(xml)
    assert counts == {
        "tests": 7, "passed": 3, "failed": 1, "errors": 1, "skipped": 2, "seconds": 12.5,
        "failed_ids": ["tests/test_a.py::test_bad", "tests/test_b.py::test_setup"],
    }  # fmt: skip
    line = report.tests_line(counts, "", "timed out after 90 s")
    assert line.splitlines() == [
        "3 passed, 1 failed, 1 errors, 2 skipped in 12 s (JUnit XML) (timed out after 90 s)",
        "  - tests/test_a.py::test_bad",
        "  - tests/test_b.py::test_setup",
    ]
    assert report.junit_counts("<not xml") is None
    # No XML: the summary line, else the progress marks.
    assert report.tests_line(None, "..F\n= 2 passed, 1 failed in 3.0s =\n", "ok").startswith(
        "2 passed, 1 failed"
    )
    assert report.tests_line(None, "..s. [ 50%]\n", "timed out").startswith(
        "cut short, no summary; progress shows 3 passed, 1 skipped"
    )


def test_the_last_json_a_command_printed_is_read_after_its_progress():
    report = _load("gpu_check_report")
    output = 'fit: trial a started\n{"not": "this"}\nfit: done\n{"verdict": "found", "rows": []}\nbye\n'
    assert report.last_json(output) == {"verdict": "found", "rows": []}
    assert report.last_json("no json {here\n") is None


def test_memory_table_gives_each_simulated_peak_and_its_error_against_the_real_one():
    report = _load("gpu_check_report")
    rows = report.memory_rows(
        {
            "char": {
                "real": {"max_memory_allocated": 100 * MIB, "max_memory_reserved": 200 * MIB},
                "runner": {"peak": 100 * MIB},
                "simulated": {"peak": 105 * MIB, "reserved_peak": 190 * MIB},
                "snapshot": {"peak": {"allocated": 100 * MIB}},
            },
            "gpt2": {"notes": ["plain run timed out after 60 s"]},
        },
        [
            {"name": "char", "family": "nanoGPT"},
            {"name": "gpt2", "family": "nanoGPT"},
            {
                "name": "vit",
                "family": "ViT",
                "skipped": "missing: scripts/check/vit.py is not in this checkout",
            },
        ],
    )
    table = report.render_memory_table(rows).splitlines()
    assert table[2] == (
        "| char | nanoGPT | 100.0 | 105.0 | +5.0% | 200.0 | 190.0 | -5.0% "
        "| 100.0 (+0.0%) | 100.0 (+0.0%) |  |"
    )
    assert table[3] == "| gpt2 | nanoGPT | - | - | - | - | - | - | - | - | plain run timed out after 60 s |"
    assert table[4].endswith("| skipped: missing: scripts/check/vit.py is not in this checkout |")


def test_the_runners_cost_is_the_spread_of_its_ratio_over_the_rounds():
    report = _load("gpu_check_report")
    rounds = [
        {"plain_ms": 10.0, "runner_ms": 10.4},
        {"plain_ms": 10.0, "runner_ms": 11.0},
        {"plain_ms": 10.0, "runner_ms": 10.2},
        {"plain_ms": 10.0, "runner_ms": None},  # a round cut short counts as run, not as a ratio
    ]
    row = report.cost_summary("char", "launch-bound", 1.05, rounds)
    assert row["ratios"] == [1.04, 1.1, 1.02]
    assert (row["ratio_min"], row["ratio_median"], row["ratio_max"]) == pytest.approx((1.02, 1.04, 1.1))
    assert row["meets_target"] is True
    assert report.cost_summary("gpt2", "GPU-bound", 1.02, rounds)["meets_target"] is False
    assert report.cost_summary("x", "GPU-bound", 1.02, [])["meets_target"] is None
    line = report.render_cost_table([row]).splitlines()[2]
    assert (
        line == "| char | launch-bound | <= 1.05x | 3 of 4 | 10.00 | 10.40 | 1.020x | 1.040x | 1.100x | yes |"
    )


def test_the_edge_record_is_shown_as_it_comes():
    report = _load("gpu_check_report")
    record = {"fraction": 0.16, "rows": [{"batch": 34, "fits": "yes"}, {"batch": 35, "fits": "no"}]}
    text = report.render_edge({"record": record})
    assert "- fraction: 0.16" in text and "| batch | fits |" in text and "| 35 | no |" in text
    assert report.render_edge({"record": {"markdown": "| a |\n"}}) == "| a |\n"
    assert report.render_edge({"notes": ["skipped: not here"]}) == "- skipped: not here\n"


@pytest.mark.parametrize(
    ("name", "total", "capability", "expected"),
    [
        ("NVIDIA H200", 150_109_880_320, [9, 0], "H200"),
        ("NVIDIA H100 80GB HBM3", 85_017_755_648, [9, 0], "H100-80GB"),
        ("NVIDIA H100 PCIe", 85_029_027_840, [9, 0], "H100-80GB"),
        ("NVIDIA A100-SXM4-80GB", 84_987_740_160, [8, 0], "A100-80GB"),
        ("NVIDIA GeForce RTX 4090", 25_756_696_576, [8, 9], "RTX-4090"),
        # The 94 GB H100 NVL is in no catalog entry: its own size and architecture.
        ("NVIDIA H100 NVL", 99_857_989_632, [9, 0], "95232MiB:sm90"),
    ],
)
def test_the_gpu_maps_to_the_catalog_by_name_and_memory(name, total, capability, expected):
    gpu_check = _load("gpu_check")
    assert gpu_check.catalog_gpu(name, total, capability) == expected


def test_the_registry_names_each_workload_once_and_times_the_two_loops_of_issue_29():
    workloads = _load("gpu_check_workloads")
    names = workloads.names()
    assert len(names) == len(set(names))
    timed = {e.name: (e.kind, e.target) for e in workloads.REGISTRY if e.kind}
    assert timed == {"nanogpt-char": ("launch-bound", 1.05), "nanogpt-gpt2": ("GPU-bound", 1.02)}
    for entry in workloads.REGISTRY:
        assert entry.home in (workloads.CHECKOUT, workloads.NANOGPT), entry


def test_a_workload_whose_script_or_module_is_missing_is_skipped_with_the_reason(tmp_path):
    workloads = _load("gpu_check_workloads")
    Entry = workloads.Entry
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "here.py").write_text("")
    entries = [
        Entry("here", "f", workloads.CHECKOUT, "scripts/here.py", ("--a", "1")),
        Entry("gone", "f", workloads.CHECKOUT, "scripts/gone.py"),
        Entry("hf", "f", workloads.CHECKOUT, "scripts/here.py", needs=("transformers",)),
        Entry("nano", "f", workloads.NANOGPT, "train.py", ("x",)),
    ]
    ready, skipped = workloads.resolve(entries, tmp_path, tmp_path / "scratch", None, "no nanoGPT", {})
    assert [(w.name, w.argv, w.cwd) for w in ready] == [
        ("here", [str(tmp_path / "scripts/here.py"), "--a", "1"], tmp_path / "scratch")
    ]
    assert skipped == [
        ("gone", "missing: scripts/gone.py is not in this checkout"),
        ("hf", "needs transformers, which does not import here"),
        ("nano", "missing: no nanoGPT"),
    ]
    ready, skipped = workloads.resolve(entries[3:], tmp_path, tmp_path, tmp_path / "nano", "", {})
    assert [(w.argv, w.cwd) for w in ready] == [(["train.py", "x"], tmp_path / "nano")] and not skipped


def test_a_step_past_its_time_is_interrupted_first_and_one_past_its_slot_is_skipped(tmp_path):
    clock = _load("gpu_check_clock")
    check = clock.Check(300, tmp_path)
    seen = []
    check.listeners.append(lambda: seen.append(check.steps[-1].name))
    child = textwrap.dedent(
        """
        import time
        print("started", flush=True)
        try:
            time.sleep(120)
        except KeyboardInterrupt:
            print("interrupted, cleaning up", flush=True)
        """
    )
    outcome = check.run("sleeper", [sys.executable, "-c", child], tmp_path, timeout=4)
    assert outcome.status == "timed out after 4 s"
    assert outcome.output.splitlines() == ["started", "interrupted, cleaning up"]
    late = check.run("late", [sys.executable, "-c", "print(1)"], tmp_path, 60, until=time.monotonic() + 1)
    assert late.status == "skipped (out of time: its slot had ended)" and late.output == ""
    assert seen == ["sleeper", "late"]


def test_a_step_is_interrupted_even_where_the_check_was_started_with_sigint_ignored(tmp_path):
    # as under `nohup make gpu-check &` or a remote runner's shell: ignored, SIGINT would
    # stay ignored in every step, which would then be killed without its summary
    import signal

    clock = _load("gpu_check_clock")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        check = clock.Check(300, tmp_path)
        child = "import time\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n    print('interrupted')"
        outcome = check.run("sleeper", [sys.executable, "-c", child], tmp_path, timeout=2)
    finally:
        signal.signal(signal.SIGINT, before)
    assert outcome.status == "timed out after 2 s" and outcome.output.strip() == "interrupted"


def test_a_pytest_run_cut_at_its_slot_still_gives_its_counts(tmp_path):
    clock, steps = _load("gpu_check_clock"), _load("gpu_check_steps")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_some.py").write_text(
        "import time\n\ndef test_a():\n    pass\n\ndef test_b():\n    assert 0\n\n"
        "def test_c():\n    time.sleep(120)\n"
    )
    check = clock.Check(300, tmp_path)
    line = steps.pytest_step(check, "tests-x", [str(suite / "test_some.py")], tmp_path, 12, check.deadline)
    first = line.splitlines()[0]
    assert first.startswith("1 passed, 1 failed in ") and first.endswith("(JUnit XML) (timed out after 12 s)")
    assert len(line.splitlines()) == 2 and line.splitlines()[1].endswith("test_some.py::test_b")
    assert (tmp_path / "tests-x.xml").is_file() and "test_b" in (tmp_path / "tests-x.log").read_text()


def test_the_report_is_rewritten_as_each_step_ends(tmp_path):
    gpu_check, clock = _load("gpu_check"), _load("gpu_check_clock")
    args = gpu_check.parse_args(["--dry", "--out", str(tmp_path)])
    check = clock.Check(args.budget, tmp_path)
    session = gpu_check.Session(args, check, "python3 scripts/gpu/gpu_check.py --dry")
    check.listeners.append(session.save)
    check.skip("first thing", "because")  # before the report folder is known: nothing written
    assert not (tmp_path / "report.md").exists()
    session.out, session.label = tmp_path, "dry-H100-80GB"
    check.skip("second thing", "because too")
    text = (tmp_path / "report.md").read_text()
    assert "in progress (written as each step ends)" in text and "- second thing: because too" in text
    assert json.loads((tmp_path / "report.json").read_text())["finished"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md", "runs.log"]


@pytest.mark.parametrize(
    ("given", "chosen"),
    [
        ([], ["memory", "fit", "tests", "cost", "evidence", "cuda-tests", "bench-line"]),
        (["--only", "convnet"], ["memory", "cost"]),
        (["--only", "tests,convnet"], ["tests"]),
        (["--skip", "cost,bench-line"], ["memory", "fit", "tests", "evidence", "cuda-tests"]),
    ],
)
def test_only_and_skip_choose_parts_and_workloads(tmp_path, given, chosen):
    gpu_check, clock = _load("gpu_check"), _load("gpu_check_clock")
    args = gpu_check.parse_args(given)
    session = gpu_check.Session(args, clock.Check(args.budget, tmp_path), "")
    assert [p for p in gpu_check.CHOSEN if session.chosen(p)] == chosen
    assert session.chosen("setup")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--only", "convnet,nope"], "--only: unknown name(s) nope: choose from nanogpt-char,"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--archive", "/no/such/folder/x.tar.gz"], "--archive /no/such/folder/x.tar.gz: no such folder"),
    ],
)
def test_a_mistaken_option_is_one_line_and_exit_2(capsys, given, message):
    gpu_check = _load("gpu_check")
    with pytest.raises(SystemExit) as stopped:
        gpu_check.parse_args(given)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_the_edge_claims_go_through_gpu_check_edge_or_are_skipped_with_the_reason(tmp_path, monkeypatch):
    fit, clock = _load("gpu_check_fit"), _load("gpu_check_clock")
    check = clock.Check(300, tmp_path)
    claims = tmp_path / "claims.json"
    rows = [{"label": "as it is", "batch": {"batch": 19}}, {"label": "checkpoint", "batch": {"batch": 29}}]
    claims.write_text(
        json.dumps(
            {"gpu": "RTX-4090", "cwd": str(tmp_path), "script": "train.py", "args": ["--batch_size=32"],
             "batch_arg": "--batch_size", "answer": {"rows": rows}}
        )
    )  # fmt: skip
    monkeypatch.setattr(fit, "EDGE", ROOT / "scripts" / "gpu" / "no_such_edge.py")
    fit.edge(check, claims, dry=True, until=check.deadline)
    assert check.steps[-1].status == "skipped (scripts/gpu/no_such_edge.py is not in this checkout)"
    # A module with check_edge's signature: called with the claims' script, arguments, GPU,
    # batch argument and the batch the advisor gave the script as it is; its record kept.
    edge = tmp_path / "gpu_check_edge.py"
    edge.write_text(
        "def check_edge(script, args, *, gpu, batch_arg, out, batch=None, dry=False):\n"
        "    return {'script': script.name, 'args': args, 'gpu': gpu, 'batch_arg': batch_arg,\n"
        "            'out': out.name, 'batch': batch, 'dry': dry}\n"
    )
    monkeypatch.setattr(fit, "EDGE", edge)
    monkeypatch.setattr(fit, "ROOT", tmp_path)
    fit.edge(check, claims, dry=True, until=check.deadline)
    assert check.steps[-1].status == "ok", check.steps[-1].output
    assert check.results["edge"]["record"] == {
        "script": "train.py", "args": ["--batch_size=32"], "gpu": "RTX-4090", "batch_arg": "--batch_size",
        "out": "record.json", "batch": 19, "dry": True,
    }  # fmt: skip


@pytest.mark.slow
def test_dry_mode_runs_the_simulated_parts_and_exits_0(tmp_path):
    out, archive = tmp_path / "out", tmp_path / "check.tar.gz"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    argv = [sys.executable, str(SCRIPTS / "gpu_check.py"), "--dry", "--only", "convnet"]
    done = subprocess.run(
        [*argv, "--out", str(out), "--archive", str(archive)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DRY MODE (--dry given)" in done.stdout
    assert "skip tests: not chosen" in done.stdout and "skip cost: dry mode" in done.stdout
    data = json.loads((out / "report.json").read_text())
    assert data["dry"] == "--dry given" and data["simulated_gpu"] == "H100-80GB" and data["finished"]
    parts = {p["name"]: p["status"] for p in data["parts"]}
    assert parts["setup"] == "done" and parts["memory"] == "done" and parts["cost"] == "skipped (dry mode)"
    [row] = data["memory"]
    assert row["workload"] == "convnet" and row["real_allocated"] is None
    # The convnet at batch 256 on the simulated H100: weights, Adam state and activations, MiBs of them.
    assert 16 * MIB < row["simulated_allocated"] <= row["simulated_reserved"] < 2**30, row
    assert data["failed"] == [], data["failed"]
    assert "| convnet | gpu_mem_track.examples convnet | - |" in (out / "report.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", "runs.log"]
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["out", "out/report.json", "out/report.md", "out/runs.log"]


@pytest.mark.slow
def test_the_plain_wrapper_keeps_the_scripts_exit_code_and_argv(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(sys.argv[1:], __name__)\nsys.exit(3)\n")
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_check_wrap.py"), str(figures), "-", str(script), "a", "--b"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "['a', '--b'] __main__\n"
    data = json.loads(figures.read_text())
    # The script never started CUDA, so no allocator figures, on any machine.
    assert data["exit_code"] == 3 and data["cuda"] is False and "max_memory_allocated" not in data


@pytest.mark.slow
def test_a_cost_round_reads_both_runs_own_iteration_times_in_turns(tmp_path):
    """The GPU steps' command lines, run on the CPU: a loop printing nanoGPT's iteration
    lines, plainly and under ``run``, and its plain run through the wrapper."""
    clock, steps, workloads = _load("gpu_check_clock"), _load("gpu_check_steps"), _load("gpu_check_workloads")
    script = tmp_path / "loop.py"
    script.write_text(
        "for i in range(9):\n    print(f'iter {i}: loss 1.0, time {100 if i < 5 else 10 + i % 2}.00ms')\n"
    )
    entry = workloads.Entry("loop", "test", workloads.CHECKOUT, "loop.py", kind="launch-bound", target=1.05)
    w = workloads.Workload(entry, [str(script)], tmp_path)
    check = clock.Check(600, tmp_path)
    first = steps.cost_round(check, w, 0, check.deadline)
    second = steps.cost_round(check, w, 1, check.deadline)
    names = ["round 1 plain", "round 1 runner", "round 2 runner", "round 2 plain"]
    assert [s.name for s in check.steps] == [f"loop cost {name}" for name in names]
    assert (first["order"], second["order"]) == ("plain/runner", "runner/plain")
    assert first["plain_ms"] == first["runner_ms"] == 10.5 and first["plain_n"] == first["runner_n"] == 4
    summary = _load("gpu_check_report").cost_summary("loop", "launch-bound", 1.05, [first, second])
    assert summary["ratios"] == [1.0, 1.0] and summary["meets_target"] is True
    steps.plainly(check, w, check.deadline)
    steps.under_runner(check, w, check.deadline)
    assert check.results["loop"]["real"]["exit_code"] == 0 and "runner" in check.results["loop"]
    assert "notes" not in check.results["loop"], check.results["loop"]
