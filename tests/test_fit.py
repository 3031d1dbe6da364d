"""The advisor (``gpu_mem_track fit``) on a fake trial runner: the plan, the combination,
the batch argument and search, the records, the text, JSON and HTML answers."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import threading

import pytest

from gpu_mem_track.advisor import fit
from gpu_mem_track.advisor.accumulation import accumulation, split_batch
from gpu_mem_track.advisor.batch import BatchArg, find_batch, start_batches
from gpu_mem_track.advisor.page import render_fit_page
from gpu_mem_track.advisor.plan import LEVERS, cheapest_combination, parse_levers
from gpu_mem_track.advisor.records import Accumulation, BatchAnswer, FitResult, LeverNote, OutOfMemory, Trial
from gpu_mem_track.advisor.render import render_fit
from gpu_mem_track.advisor.trials import TrialPool, TrialSpec, read_trial
from gpu_mem_track.errors import UsageError
from gpu_mem_track.levers.allocator import NOT_TRIED
from gpu_mem_track.runfolder.records import RunInfo, SimulationInfo, StopInfo

MiB = 1 << 20
CAPACITY = 1000 * MiB

#: Saved bytes per sample by each lever the fake models; the others do not apply.
SAVES = {"expandable": 5, "checkpoint": 60, "grads-to-none": 0}
CHANGES = {
    "expandable": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "checkpoint": "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
    "grads-to-none": "optimizer.zero_grad(set_to_none=True)",
}


class FakeRunner:
    """A script whose peak reserved is ``base + per * batch`` MiB (batch 10 when not
    set), less each applied lever's ``SAVES`` per sample; above the capacity it runs out
    of memory. ``fail`` makes the script raise. A step takes ``samples`` (the batch
    clamped to ``(low, high)``: a dataset smaller than the batch, rounding at small ones)."""

    def __init__(
        self,
        base: int = 200,
        per: int = 100,
        fail: bool = False,
        saves: dict | None = None,
        samples: tuple[int, int] = (1, 1 << 30),
    ) -> None:
        self.base, self.per, self.fail, self.samples = base, per, fail, samples
        self.saves = SAVES if saves is None else saves
        self.calls: list[TrialSpec] = []
        self.lock = threading.Lock()

    def reserved(self, levers: tuple[str, ...], batch: int) -> int:
        per = self.per - sum(self.saves.get(n, 0) for n in levers)
        return (self.base + per * min(max(batch, self.samples[0]), self.samples[1])) * MiB

    def __call__(self, spec: TrialSpec) -> Trial:
        with self.lock:
            self.calls.append(spec)
        batch = 10 if spec.batch is None else spec.batch
        notes = tuple(
            LeverNote(n, True, change=CHANGES[n], cost="none" if n != "checkpoint" else "one more forward")
            if n in self.saves
            else LeverNote(n, False, reason=f"{n} does not apply here")
            for n in spec.levers
        )
        folder = f"/runs/{spec.name}"
        if self.fail:
            return Trial(spec.levers, spec.batch, folder, 1, capacity=CAPACITY, notes=notes, error="exited 1")
        reserved = self.reserved(spec.levers, batch)
        if reserved > CAPACITY:
            oom = OutOfMemory("/s/train.py:7", 64 * MiB, CAPACITY - 100 * MiB, CAPACITY - 16 * MiB, CAPACITY)
            return Trial(spec.levers, spec.batch, folder, 1, oom=oom, capacity=CAPACITY, notes=notes)
        return Trial(
            spec.levers,
            spec.batch,
            folder,
            0,
            reserved - 8 * MiB,
            reserved,
            "/s/train.py:9",
            None,
            CAPACITY,
            notes,
        )


@pytest.fixture
def script(tmp_path, monkeypatch):
    """The script, with the working folder at ``tmp_path``: ``fit`` makes its session
    folder under ``reports/`` there up front, not in the checkout's."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.py"
    path.write_text("print('never run: the runner is fake')\n")
    return path


def test_levers_are_ordered_cheapest_first_and_checked():
    assert parse_levers(None) == LEVERS
    assert parse_levers("checkpoint, expandable") == ("expandable", "checkpoint")
    with pytest.raises(UsageError, match="unknown lever 'bf16'"):
        parse_levers("bf16")
    with pytest.raises(UsageError, match="twice"):
        parse_levers("fused,fused")


@pytest.mark.parametrize(
    ("where", "args", "value", "moved"),
    [
        ("--batch_size", ["--batch_size=32", "--x=1"], 32, ("--batch_size=48", "--x=1")),
        ("--batch_size", ["--batch_size", "32", "--x", "1"], 32, ("--batch_size", "48", "--x", "1")),
        ("1", ["data", "16"], 16, ("data", "48")),
    ],
)
def test_the_batch_argument_is_read_and_rewritten(where, args, value, moved):
    arg = BatchArg.parse(where)
    assert arg.value(args) == value
    assert arg.with_batch(args, 48) == moved


@pytest.mark.parametrize(
    ("where", "args", "message"),
    [
        ("--batch_size", ["--lr=1"], "do not hold it"),
        ("--batch_size", ["--batch_size"], "no value follows"),
        ("--batch_size", ["--batch_size=0"], "'0' is not a positive integer"),
        ("--batch_size", ["--batch_size=big"], "'big' is not a positive integer"),
        (
            "3",
            ["a"],
            "--batch-arg 3 (counted from 0) names the 4th argument after the script (sys.argv[4]), "
            "but the script has 1 argument(s): a",
        ),
        (
            "1",
            ["16", "1024x"],
            "--batch-arg 1 (counted from 0) took '1024x', the 2nd argument after the script "
            "(sys.argv[2]): not a positive integer (0 is the first argument after the script)",
        ),
        ("x", ["a"], "an option (e.g. --batch_size) or an index"),
    ],
)
def test_a_bad_batch_argument_is_one_usage_error(where, args, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        BatchArg.parse(where).value(args)


def test_the_search_starts_from_the_users_batch_halving_it_until_one_fits():
    fake = FakeRunner()  # 200 + 100 b MiB within 1000 MiB: batch 8 fits, 9 does not
    ran = []

    def run(b):
        ran.append(b)
        return fake(TrialSpec((), b))

    assert start_batches(run, 8) == (4, 8) and ran == [8]
    ran.clear()
    assert start_batches(run, 40) == (5, 10) and ran == [40, 20, 10, 5]
    assert start_batches(lambda b: FakeRunner(base=2000)(TrialSpec((), b)), 4) == ()


def test_a_search_from_far_above_finds_the_batch_and_counts_every_trial():
    fake = FakeRunner()
    answer = find_batch(lambda b: fake(TrialSpec((), b)), 40, CAPACITY)
    assert answer.batch == 8 and answer.tried[:4] == (40, 20, 10, 5) and 9 in answer.tried
    assert find_batch(lambda b: FakeRunner(base=2000)(TrialSpec((), b)), 2, CAPACITY).batch == 0


def test_the_batch_search_finds_the_largest_batch_that_fits_and_proves_the_next_does_not():
    fake = FakeRunner()  # 200 + 100 b MiB within 1000 MiB: batch 8 fits, 9 does not

    def trial_at(b):
        return fake(TrialSpec((), None if b == 10 else b))

    answer = find_batch(trial_at, 10, CAPACITY)
    assert answer.batch == 8
    assert answer.reserved_peak == 1000 * MiB
    assert 9 in answer.tried and 8 in answer.tried
    assert answer.folder == "/runs/baseline-b8"


def test_a_peak_that_stops_growing_with_the_batch_ends_the_search_with_any_batch(script):
    fake = FakeRunner(samples=(1, 4))  # a dataset of 4 samples: 600 MiB from batch 4 on

    answer = find_batch(lambda b: fake(TrialSpec((), None if b == 10 else b)), 10, CAPACITY)
    assert answer == BatchAnswer(10240, 600 * MiB, "/runs/baseline-b10240", (10, 5, 10240), flat_from=5)
    result = fit(script, ["--bs=10"], gpu="2GiB:sm80", runner=fake, levers="expandable", batch_arg="--bs")
    text = render_fit(result)
    assert "As it is, any batch fits (--bs; you run 10): the same peak at batch 5 and 10240" in text
    assert "as it is  yes         any" in text
    assert result.rows[0].batch.flat_from == 5


def test_equal_peaks_at_small_batches_jump_once_then_search_on():
    fake = FakeRunner(samples=(2, 1 << 30))  # batches 1 and 2 round to the same peak

    answer = find_batch(lambda b: fake(TrialSpec((), b)), 2, CAPACITY)
    assert (answer.batch, answer.flat_from) == (8, None)
    assert 2048 in answer.tried  # the one jump: it ran out, so the batch still matters


def test_a_stopped_pool_tells_running_trials_from_those_never_started():
    started, release = threading.Event(), threading.Event()

    def runner(spec):
        started.set()
        release.wait(10)
        return FakeRunner()(spec)

    pool = TrialPool(runner, jobs=1)
    first, second = TrialSpec((), 1), TrialSpec((), 2)
    pool.submit(first), pool.submit(second)  # one slot: the second waits for it
    assert started.wait(10)
    runner.stop = release.set  # the runner's stop ends the running trial
    assert pool.stop() == ([first], [second])


def test_the_combination_accumulates_then_drops_what_is_not_needed():
    fake = FakeRunner(base=0, per=120, saves={"expandable": 10, "grads-to-none": 1, "checkpoint": 15})
    pool = TrialPool(fake, jobs=2)
    # 1200 MiB at batch 10: each alone is short; expandable + checkpoint (950 MiB) fits
    run, found = cheapest_combination(pool, ["expandable", "grads-to-none", "checkpoint"], 0.99, jobs=2)
    pool.close()
    assert found is not None and found.levers == ("expandable", "checkpoint")
    assert [t.levers for t in run] == [
        ("expandable", "grads-to-none"),
        ("expandable", "grads-to-none", "checkpoint"),
        ("grads-to-none", "checkpoint"),
        ("expandable", "checkpoint"),
    ]


def test_fit_tries_each_lever_and_recommends_the_cheapest_that_fits(script):
    fake = FakeRunner()  # 1200 MiB at batch 10; checkpoint alone: 600 MiB
    result = fit(script, ["--batch_size=10"], gpu="2GiB:sm80", runner=fake, jobs=3)
    assert result.verdict == "found" and result.exit_code == 0
    assert result.recommended == "checkpoint"
    assert [r.label for r in result.rows] == ["as it is", "expandable", "grads-to-none", "checkpoint"]
    first, _, _, best = result.rows
    assert (first.fits, first.margin, first.at_least, first.line) == ("no", -48 * MiB, True, "/s/train.py:7")
    assert (best.fits, best.reserved_peak, best.margin) == ("yes", 600 * MiB, 400 * MiB)
    assert best.change == CHANGES["checkpoint"]
    assert dict(result.not_applied) == {
        "gc-threshold": NOT_TRIED["gc-threshold"],  # no trial of it
        **{n: f"{n} does not apply here" for n in ("no-foreach", "fused", "autocast")},
    }
    assert [name for name, _ in result.not_applied] == ["no-foreach", "fused", "gc-threshold", "autocast"]
    assert result.trials == len(LEVERS)  # the script as it is and each lever but gc-threshold
    assert result.capacity == CAPACITY


def test_a_lever_the_run_never_reached_before_running_out_says_so(script):
    class NeverReached(FakeRunner):
        def __call__(self, spec: TrialSpec) -> Trial:
            trial = super().__call__(spec)
            if spec.levers == ("fused",):  # out of memory (as it is) before any optimizer was built
                reason = "the script built no torch.optim optimizer while it ran"
                note = LeverNote("fused", False, reason=reason, reached=False)
                return Trial(
                    spec.levers, spec.batch, trial.folder, 1, oom=trial.oom, capacity=CAPACITY, notes=(note,)
                )
            return trial

    result = fit(script, ["--batch_size=10"], gpu="2GiB:sm80", runner=NeverReached(), jobs=3)
    assert dict(result.not_applied)["fused"] == (
        "the script built no torch.optim optimizer while it ran (its trial ran out of memory at "
        "/s/train.py:7 first; not tried in combinations)"
    )
    assert dict(result.not_applied)["autocast"] == "autocast does not apply here"  # a trial that ran out too


def test_fit_with_a_batch_argument_gives_each_row_its_largest_batch(script):
    fake = FakeRunner()
    result = fit(
        script,
        ["--batch_size=10"],
        gpu="2GiB:sm80",
        runner=fake,
        batch_arg="--batch_size",
        levers="expandable,checkpoint",
    )
    batches = {r.label: r.batch.batch for r in result.rows}
    assert batches == {"as it is": 8, "expandable": 8, "checkpoint": 20}  # (1000-200)/40 = 20
    assert sum(1 for s in fake.calls if s == TrialSpec(("checkpoint",), None)) == 1  # reused, not rerun
    text = render_fit(result)
    assert "With checkpoint, batch 20 fits (--batch_size; you run 10)." in text


def test_a_script_that_fits_runs_one_trial(script):
    fake = FakeRunner(per=50)  # 700 MiB at batch 10: 70%
    result = fit(script, gpu="2GiB:sm80", runner=fake)
    assert (result.verdict, result.trials, result.exit_code) == ("fits", 1, 0)
    assert "It fits as it is: 300.00 MiB (30%) headroom, peak at train.py:9." in render_fit(result)


def test_a_tight_script_tries_the_levers(script):
    fake = FakeRunner(per=75)  # 950 MiB: above 90%
    result = fit(script, gpu="2GiB:sm80", runner=fake, levers="expandable,checkpoint")
    assert result.rows[0].fits == "tight"
    # expandable's 900 MiB is exactly 90% of the capacity: it fits, and is cheaper than checkpoint
    assert (result.row("expandable").fits, result.row("checkpoint").fits) == ("yes", "yes")
    assert result.recommended == "expandable"


def test_a_script_that_fails_for_another_reason_tries_nothing(script):
    fake = FakeRunner(fail=True)
    result = fit(script, gpu="2GiB:sm80", runner=fake)
    assert (result.verdict, result.exit_code, result.trials) == ("failed", 1, 1)
    assert (
        "failed for a reason other than memory (exited 1); no levers tried. See /runs/baseline"
        in render_fit(result)
    )


def test_nothing_fits_at_any_batch_exits_1(script):
    fake = FakeRunner(base=2000)
    result = fit(script, gpu="2GiB:sm80", runner=fake, levers="expandable,checkpoint")
    assert (result.verdict, result.exit_code, result.recommended) == ("none", 1, None)
    assert [r.label for r in result.rows][-1] == "expandable + checkpoint"
    assert "Nothing tried fits" in render_fit(result)
    never = fit(script, ["--bs=10"], gpu="2GiB:sm80", runner=fake, levers="expandable", batch_arg="--bs")
    assert (never.verdict, never.exit_code, never.accumulation) == ("none", 1, None)
    assert "Nothing tried fits at any batch tried (--bs)" in render_fit(never)


def test_nothing_fits_at_the_users_batch_leads_with_the_change_that_reaches_the_largest_batch(script):
    """As it is 3 (300/100 MiB a sample), expandable 3, checkpoint 7, both 8: nothing
    fits at 10, so the answer is expandable + checkpoint at batch 8, exit 3."""
    result = fit(
        script,
        ["--bs=10", "--grad_accum=2"],
        gpu="2GiB:sm80",
        runner=FakeRunner(base=700),
        levers="expandable,checkpoint",
        batch_arg="--bs",
    )
    assert (result.verdict, result.exit_code) == ("smaller", 3)
    assert result.recommended == "expandable + checkpoint"
    assert {r.label: r.batch.batch for r in result.rows} == {
        "as it is": 3,
        "expandable": 3,
        "checkpoint": 7,
        "expandable + checkpoint": 8,
    }
    assert result.accumulation == Accumulation(batch=5, steps=2, how="--grad_accum=4 (2 x 2)")
    lines = render_fit(result).splitlines()
    assert lines[1:5] == [
        "Nothing fits at batch 10 (--bs). Best: expandable + checkpoint, which fits batch 8 (the largest "
        "batch of any row; on a tie the cheapest).",
        f"  To make it: {CHANGES['expandable']}; {CHANGES['checkpoint']}; and run batch 8.",
        "  Cost: none; one more forward.",
        "  To keep the effective batch of 10: batch 5 x 2 accumulation steps (--grad_accum=4 (2 x 2)).",
    ]
    table = lines[lines.index("  The other rows follow, best first.") + 1 :]
    assert table[0].split() == [
        "change",
        "fits",
        "at",
        "10",
        "largest",
        "batch",
        "headroom",
        "at",
        "10",
        "cost",
    ]
    firsts = [line.split("  ")[1].strip() for line in table[1:5]]
    assert firsts == ["expandable + checkpoint (recommended)", "checkpoint", "as it is", "expandable"]
    again = FitResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result and again.to_dict()["recommended"] == "expandable + checkpoint"
    page = render_fit_page(result)
    assert page.count("<tr class='recommended'>") == 2  # the table and the details
    assert "Nothing fits at batch 10" in page


def test_on_a_tie_the_cheapest_change_is_the_answer_and_no_accumulation_argument_says_nothing(script):
    result = fit(
        script,
        ["--bs=10"],
        gpu="2GiB:sm80",
        runner=FakeRunner(base=700, saves={"expandable": 0, "checkpoint": 60}),
        levers="expandable,checkpoint",
        batch_arg="--bs",
    )
    assert result.recommended == "checkpoint" and result.row("expandable + checkpoint").batch.batch == 7
    assert (result.verdict, result.accumulation) == ("smaller", None)
    assert "accumulation" not in render_fit(result)


def test_as_it_is_at_a_smaller_batch_is_the_answer_when_no_lever_helps(script):
    result = fit(
        script, ["8"], gpu="2GiB:sm80", runner=FakeRunner(base=700), levers="expandable", batch_arg="0"
    )
    assert (result.verdict, result.recommended, result.exit_code) == ("smaller", "as it is", 3)
    assert "Best: no change, a smaller batch, which fits batch 3" in render_fit(result)
    assert "  To make it: run batch 3." in render_fit(result).splitlines()


@pytest.mark.parametrize(
    ("batch", "fits", "split"),
    [(32, 27, (16, 2)), (33, 27, (17, 2)), (32, 5, (5, 7)), (100, 30, (25, 4)), (8, 8, (8, 1))],
)
def test_the_batch_is_split_into_the_fewest_accumulation_steps(batch, fits, split):
    assert split_batch(batch, fits) == split


@pytest.mark.parametrize(
    ("text", "args", "how"),
    [
        ("", ["--gradient_accumulation_steps=4"], "--gradient_accumulation_steps=8 (4 x 2)"),
        ("", ["--gradient_accumulation_steps", "1"], "--gradient_accumulation_steps=2"),
        ("p.add_argument('--grad-accum', type=int)", [], "--grad-accum=2"),
        (
            "TrainingArguments(out, gradient_accumulation_steps=3)",
            [],
            "TrainingArguments(gradient_accumulation_steps=6) (3 x 2)",
        ),
        (
            "TrainingArguments(out, per_device_train_batch_size=b)",
            [],
            "TrainingArguments(gradient_accumulation_steps=2)",
        ),
        ("HfArgumentParser((TrainingArguments,))", [], "--gradient_accumulation_steps=2"),
        ("p.add_argument('--grad_accum', type=int, default=4)", [], "--grad_accum=8 (4 x 2)"),
        (
            "gradient_accumulation_steps = 5 * 8  # used to simulate larger batches\n"
            "exec(open('configurator.py').read())",
            ["--batch_size=32"],
            "--gradient_accumulation_steps=80 (40 x 2)",
        ),
        ("gradient_accumulation_steps = 4\nfor x in data: model(x)", [], None),  # no way to set it
        ("for x in data: model(x)", ["--steps=3"], None),
    ],
)
def test_the_accumulation_is_set_by_the_scripts_own_argument(text, args, how):
    found = accumulation(text, args, 32, 27)
    assert (found.how if found else None) == how
    if found:
        assert (found.batch, found.steps) == (16, 2)


def test_the_answer_round_trips_through_json_and_renders_the_same(script):
    result = fit(script, ["--batch_size=10"], gpu="2GiB:sm80", runner=FakeRunner(), batch_arg="--batch_size")
    again = FitResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    assert render_fit(again) == render_fit(result)


def test_the_table_text(script):
    """The answer first, then the table best first (the change, fits, headroom, cost),
    then the details (peaks, line, change to make)."""
    result = fit(script, gpu="2GiB:sm80", runner=FakeRunner(), levers="expandable,checkpoint", jobs=1)
    lines = render_fit(result).splitlines()
    assert lines[1] == f"Recommended: checkpoint (cheapest change that fits): {CHANGES['checkpoint']}"
    assert lines[2].split() == ["change", "fits", "headroom", "cost"]
    assert lines[3].split() == [
        "checkpoint",
        "(recommended)",
        "yes",
        "400.00",
        "MiB",
        "(40%)",
        "one",
        "more",
        "forward",
    ]
    assert lines[4].split()[:4] == ["as", "it", "is", "no"] and "short >= 48.00 MiB" in lines[4]
    assert lines[5].split()[:2] == ["expandable", "no"]  # as short as it is, and costs more
    assert lines[6] == "Details:"
    assert lines[7].split() == ["change", "peak", "allocated", "peak", "reserved", "line", "to", "make", "it"]
    assert lines[8].split()[:6] == ["checkpoint", "(recommended)", "592.00", "MiB", "600.00", "MiB"]
    assert lines[8].endswith(CHANGES["checkpoint"]) and "train.py:9" in lines[8]
    assert (
        lines[9].split()[:7] == ["as", "it", "is", "900.00", "MiB", "984.00", "MiB"]
        and "train.py:7" in lines[9]
    )


def test_the_html_page_holds_the_table_and_the_answer(script):
    result = fit(script, gpu="2GiB:sm80", runner=FakeRunner(), levers="expandable,checkpoint")
    page = render_fit_page(result)
    assert page.count("<tr>") == 6  # two tables: a header and two rows each
    assert page.count("<tr class='recommended'>") == 2
    assert page.index("Recommended: checkpoint") < page.index("<table")
    assert "<style>" in page and "<script" not in page


def test_read_trial_reads_a_run_folder(tmp_path):
    oom = {"filename": "a.py", "line": 5, "request": 300, "allocated": 600, "reserved": 700, "capacity": 850}
    gpu = {
        "name": "g",
        "total_memory": 1000,
        "context_bytes": 100,
        "library_bytes": 50,
        "cublas_workspace": 0,
    }
    info = RunInfo(
        "t",
        "a.py",
        ("a.py",),
        "cuda:0",
        "CUDA caching allocator",
        "sys.settrace",
        0.0,
        "3.11",
        "",
        "",
        exit_code=1,
        peak=10,
        reserved_peak=20,
        peak_at="a.py:3",
        simulation=SimulationInfo(gpu, out_of_memory=oom),
        stopped=StopInfo("max-iterations", "a.py", 3, 4, 1.0),
        levers=(
            {"name": "checkpoint", "applied": True, "change": "c", "cost": "w", "changes_results": False},
        ),
    )
    meta = info.to_dict()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "meta.json").write_text(json.dumps(meta))
    trial = read_trial(tmp_path / "t", ("checkpoint",), 4)
    assert trial.oom == OutOfMemory("a.py:5", 300, 600, 700, 850)
    assert (trial.oom.shortfall, trial.capacity, trial.fits(0.9)) == (150, 850, "no")
    assert trial.notes == (LeverNote("checkpoint", True, change="c", cost="w"),)
    assert trial.stopped == "max-iterations"
    missing = read_trial(tmp_path / "none", (), None, 2)
    assert missing.fits(0.9) == "failed" and "no run description" in missing.error


def test_the_advisor_imports_no_torch():
    """The advisor only runs trials in child processes: importing it (and the command)
    leaves torch unimported, so ``fit --help`` and its usage errors are quick."""
    import subprocess
    import sys

    code = "import sys, gpu_mem_track.advisor, gpu_mem_track.commands.fit; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


def test_gpu_mem_track_fit_is_the_function():
    import gpu_mem_track

    assert gpu_mem_track.fit is fit and "fit" in gpu_mem_track.__all__


def test_rows_cut_short_by_a_bound_say_so(script):
    def bounded(spec):
        trial = FakeRunner(per=50)(spec)
        return Trial(**{**trial.__dict__, "stopped": "max-iterations"})

    result = fit(script, gpu="2GiB:sm80", runner=bounded, max_iterations=3)
    assert result.rows[0].stopped == "max-iterations"
    assert "Note: stopped by --max-iterations or --max-seconds, not once steady: as it is." in render_fit(
        result
    )
    steady = fit(script, gpu="2GiB:sm80", runner=FakeRunner(per=50))
    assert "Note: stopped" not in render_fit(steady)


def test_a_row_that_ran_out_shows_the_highest_memory_before_it_did():
    from gpu_mem_track.advisor.plan import make_row

    oom = OutOfMemory("/s/train.py:7", 300 * MiB, 700 * MiB, 900 * MiB, CAPACITY)
    trial = Trial(("expandable",), None, "/runs/x", 1, 800 * MiB, 950 * MiB, "/s/train.py:5", oom, CAPACITY)
    row = make_row(trial, 0.9)
    assert (row.peak, row.reserved_peak) == (800 * MiB, 950 * MiB)  # not the 700/900 at the failed request
    assert (row.fits, row.margin, row.at_least, row.line) == ("no", -200 * MiB, True, "/s/train.py:7")


def test_a_compiled_baseline_says_so_in_the_answer_its_json_and_its_page(tmp_path, script):
    """A trial whose run compiled regions carries the simulation's note; the answer
    repeats the baseline's once, as text, in JSON and on the page (regions run as eager)."""
    record = {
        "filename": "train.py",
        "line": 208,
        "api": "torch.compile",
        "backend": "inductor",
        "mode": "",
        "count": 1,
    }
    gpu = {"name": "g", "total_memory": 1000, "context_bytes": 100, "library_bytes": 0, "cublas_workspace": 0}
    info = RunInfo(
        "t", "a.py", ("a.py",), "cuda:0", "CUDA caching allocator", "sys.settrace", 0.0, "3.11", "", "",
        exit_code=0, peak=10, reserved_peak=20, peak_at="a.py:3",
        simulation=SimulationInfo(gpu, compiled=(record,)),
    )  # fmt: skip
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "meta.json").write_text(json.dumps(info.to_dict()))
    note = read_trial(tmp_path / "t", (), None).compiled
    assert note.startswith("torch.compile at train.py:208: 1 compiled region simulated as eager")

    class Compiled(FakeRunner):
        def __call__(self, spec: TrialSpec) -> Trial:
            return dataclasses.replace(super().__call__(spec), compiled=note)

    result = fit(script, gpu="2GiB:sm80", runner=Compiled(), levers="expandable,checkpoint", jobs=1)
    assert result.compiled == note
    assert render_fit(result).splitlines().count(f"Note: {note}") == 1
    assert FitResult.from_dict(json.loads(json.dumps(result.to_dict()))).compiled == note
    assert html.escape(note) in render_fit_page(result)
    plain = fit(script, gpu="2GiB:sm80", runner=FakeRunner(), levers="expandable,checkpoint", jobs=1)
    assert plain.compiled == "" and "Note:" not in render_fit(plain)


def test_the_recommended_change_says_where_it_goes_where_the_lever_knew():
    from gpu_mem_track.advisor.distributed import WorldRow, _launch
    from gpu_mem_track.advisor.plan import make_row
    from gpu_mem_track.advisor.records import FitRow, Trial
    from gpu_mem_track.advisor.render import placed

    notes = (
        LeverNote("expandable", True, change="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        LeverNote("checkpoint", True, change=CHANGES["checkpoint"], where="/a/model.py:45"),
    )
    trial = Trial(
        ("expandable", "checkpoint"), None, "/runs/x", 0, peak=1, reserved_peak=1, capacity=9, notes=notes
    )
    row = make_row(trial, 0.9)
    assert row.change == f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; {CHANGES['checkpoint']}"
    assert (
        placed(row)
        == f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; {CHANGES['checkpoint']} (at model.py:45)"
    )
    assert FitRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row
    launch = _launch(WorldRow(row, 2, 0), "train.py", (), 2, None)
    assert launch[-1] == f"{CHANGES['checkpoint']}  # at model.py:45"
