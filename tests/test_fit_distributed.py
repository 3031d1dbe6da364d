"""``fit --nproc-per-node``'s advisor (``advisor.distributed``, ``advisor.world``) with a
fake runner: which trials run at which world size, the worst rank's figures, the world
size search, the answer per GPU and its exit code; and the ranks' environment."""

from __future__ import annotations

import html
import json
import threading
from dataclasses import replace

import pytest

from gpu_mem_track.advisor.distributed import fit_distributed
from gpu_mem_track.advisor.records import LeverNote, OutOfMemory, Trial
from gpu_mem_track.advisor.world import RanksRunner, WorldSpec, distinct_ranks, rank_environ, rank_of, worst
from gpu_mem_track.advisor.worldrender import render_distributed
from gpu_mem_track.errors import UsageError
from gpu_mem_track.units import format_bytes

GIB = 1 << 30
CAPACITY = 40 * GIB


class FakeRanks:
    """A world's trial from a memory model: per rank, ``states / shards + activations``
    (FSDP2 and ZeRO shard; the script as it is does not), the last rank 1 GiB above rank
    0 under FSDP2 (its padded shards); out of memory above the capacity, short by what
    it needs above it. ``autocast`` halves the activations (not applied when the script
    computes in bfloat16 already: ``low_precision``), ``checkpoint`` quarters them,
    ``fsdp2-bf16`` takes a third off them."""

    def __init__(
        self,
        states: int,
        activations: int,
        shards_itself: bool = False,
        low_precision: bool = False,
        samples: int | None = None,
    ) -> None:
        self.states, self.activations, self.shards_itself = states, activations, shards_itself
        self.low_precision, self.samples = low_precision, samples  # samples: a step takes at most
        self.specs: list[WorldSpec] = []
        self.lock = threading.Lock()

    def __call__(self, spec: WorldSpec) -> Trial:
        with self.lock:
            self.specs.append(spec)
        notes = tuple(self.note(name) for name in spec.levers)
        applied = {n.name for n in notes if n.applied}
        per_rank = []
        for rank in distinct_ranks(spec.world):
            states = self.states
            if "fsdp2" in applied or self.shards_itself:
                states = states // spec.world + (GIB if rank == spec.world - 1 and spec.world > 1 else 0)
            elif "zero" in applied:
                states = states // 2 + states // (2 * spec.world)
            batch = min(spec.batch or 8, self.samples or 1 << 30)
            activations = self.activations * batch // 8
            activations //= (2 if "autocast" in applied else 1) * (4 if "checkpoint" in applied else 1)
            activations -= activations // 3 if "fsdp2-bf16" in applied else 0
            need = states + activations
            folder = f"/s/{spec.name}/rank{rank}"
            if need > CAPACITY:
                reserved = CAPACITY - GIB // 2
                oom = OutOfMemory(
                    "train.py:30", max(GIB, need - reserved), CAPACITY - GIB, reserved, CAPACITY
                )
                per_rank.append(
                    Trial(spec.levers, spec.batch, folder, 1, oom=oom, capacity=CAPACITY, notes=notes)
                )
            else:
                per_rank.append(
                    Trial(
                        spec.levers,
                        spec.batch,
                        folder,
                        0,
                        need,
                        need,
                        "train.py:30",
                        capacity=CAPACITY,
                        notes=notes,
                    )
                )
        return worst(per_rank)

    def note(self, name: str) -> LeverNote:
        if name == "fsdp2" and self.shards_itself:
            return LeverNote(name, False, "the script shards with fully_shard itself")
        if name == "zero" and self.shards_itself:
            return LeverNote(name, False, "the model is sharded with FSDP2")
        if name == "autocast" and self.low_precision:
            return LeverNote(name, False, "the script already autocasts (bfloat16): autocast changes nothing")
        change = {
            "fsdp2": "for block in model.h: fully_shard(block); fully_shard(model)",
            "checkpoint": "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
        }.get(name, "")
        return LeverNote(name, True, "", change=change, cost=f"{name} words")


def fit(tmp_path, fake, args=("--batch_size=8",), **options):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    return fit_distributed(script, args, gpu="A100-40GB", runner=fake, out_dir=tmp_path, jobs=4, **options)


def test_a_model_too_big_for_its_ranks_gets_fsdp2_and_the_smallest_world_that_fits(tmp_path):
    fake = FakeRanks(states=60 * GIB, activations=10 * GIB)
    result = fit(tmp_path, fake, nproc=4)
    labels = [(r.row.label, r.world, r.row.fits) for r in result.rows]
    assert labels[0] == ("as it is", 4, "no")
    assert ("zero", 4, "no") in labels  # 30 + 7.5 + 10 GiB
    assert ("fsdp2", 4, "yes") in labels  # 15 + 1 + 10 GiB on the last rank
    assert ("fsdp2 + no-reshard", 4, "yes") in labels
    assert result.sharding == ("fsdp2",)
    assert dict(result.worlds) == {2: "no", 4: "yes"}  # 30 + 1 + 10 > 40 GiB on 2
    assert result.world == 4
    assert result.answer == "fits on 4 x A100-40GB with fsdp2; not on 2"
    assert result.launch[0] == f"torchrun --nproc-per-node 4 {tmp_path / 'train.py'} --batch_size=8"
    assert "for block in model.h: fully_shard(block)" in result.launch
    assert result.exit_code == 0
    assert {s.world for s in fake.specs} == {2, 4}  # 1 is not tried: 2 did not fit
    assert not [s for s in fake.specs if "checkpoint" in s.levers]  # a sharding fits: no combination
    [fsdp2] = [r for r in result.rows if r.row.label == "fsdp2"]
    assert fsdp2.rank == 3  # the last rank holds the padded shards: the worst
    json.dumps(result.to_dict())
    text = render_distributed(result)
    assert "Answer: fits on 4 x A100-40GB with fsdp2; not on 2" in text
    assert "NCCL's own memory" in text


def test_more_ranks_are_found_when_the_asked_ones_are_too_few(tmp_path):
    fake = FakeRanks(states=200 * GIB, activations=10 * GIB)
    result = fit(tmp_path, fake, nproc=2)
    assert result.world == 8  # 25 + 1 + 10 GiB; on 4: 50 + 1 + 10
    assert dict(result.worlds)[4] == "no" and dict(result.worlds)[8] == "yes"
    assert result.answer == "fits on 8 x A100-40GB with fsdp2; not on 4"
    assert result.launch[0].startswith("torchrun --nproc-per-node 8 ")
    assert result.rows[-1].world == 8 and result.rows[-1].row.fits == "yes"


def test_nothing_fits_at_any_world_size(tmp_path):
    fake = FakeRanks(states=GIB, activations=300 * GIB)
    result = fit(tmp_path, fake, nproc=4)
    assert result.world is None and result.verdict == "none"
    assert result.exit_code == 1
    assert result.answer.startswith("does not fit on ")
    assert dict(result.worlds)[64] == "no"


def test_the_batch_per_gpu_is_searched_for_each_row(tmp_path):
    fake = FakeRanks(states=60 * GIB, activations=30 * GIB)
    result = fit(tmp_path, fake, nproc=4, batch_arg="--batch_size")
    first = result.rows[0].row
    assert first.fits == "no" and first.batch is not None
    [fsdp2] = [r.row for r in result.rows if r.row.label == "fsdp2" and r.world == 4]
    assert fsdp2.batch is not None and fsdp2.batch.batch >= 1
    # 15 + 1 + 30 * b / 8 <= 40 GiB: b = 6 per GPU
    assert fsdp2.batch.batch == 6
    assert result.exit_code in (0, 3)


def test_a_fit_as_it_is_names_the_largest_batch_as_a_bound_not_as_the_batch_to_run(tmp_path):
    fake = FakeRanks(states=GIB, activations=GIB)
    result = fit(tmp_path, fake, nproc=4, batch_arg="--batch_size", max_batch=64)
    assert result.rows[0].row.fits == "yes" and result.rows[0].row.batch.batch == 64
    # the script's batch 8 fits: 64 is how far it could go, which "at batch 64" did not say
    assert result.answer == "fits on 4 x A100-40GB as it is, up to batch 64 per GPU"


def test_a_batch_that_stops_mattering_is_any_batch_per_gpu(tmp_path):
    fake = FakeRanks(states=GIB, activations=GIB, samples=16)  # the data gives 16 per step at most
    result = fit(tmp_path, fake, nproc=4, batch_arg="--batch_size")
    answer = result.rows[0].row.batch  # tried 8, 4, then 128 and 2048: the same peaks; 2048 x 1024 too
    assert (answer.tried, answer.flat_from, answer.batch) == ((8, 4, 128, 2048, 1 << 20), 128, 1 << 20)
    assert result.answer.startswith(
        "fits on 4 x A100-40GB as it is, at any batch per GPU (the same peak at batch 128 and 1048576"
    )


def test_a_script_that_shards_itself_gets_the_options_and_the_world_search(tmp_path):
    fake = FakeRanks(states=100 * GIB, activations=10 * GIB, shards_itself=True)
    result = fit(tmp_path, fake, nproc=2)
    assert dict(result.not_applied)["fsdp2"] == "the script shards with fully_shard itself"
    assert result.rows[0].row.fits == "no"  # 50 + 1 + 10 GiB
    assert result.sharding == ()
    assert result.world == 4  # 25 + 1 + 10


def test_it_fits_as_it_is_and_nothing_else_runs(tmp_path):
    fake = FakeRanks(states=GIB, activations=GIB)
    result = fit(tmp_path, fake, nproc=4)
    assert result.verdict == "fits" and result.exit_code == 0
    assert [s.name for s in fake.specs] == ["baseline-w4"]
    assert render_distributed(result).splitlines()[-1].startswith("1 trial in ")  # not "1 trials"


def test_usage_mistakes(tmp_path):
    with pytest.raises(UsageError, match="--nproc-per-node"):
        fit(tmp_path, FakeRanks(GIB, GIB), nproc=65)
    with pytest.raises(UsageError, match="no such script"):
        fit_distributed(tmp_path / "missing.py", gpu="A100-40GB", nproc=2)


def test_the_distinct_ranks_and_their_environment():
    assert distinct_ranks(1) == (0,)
    assert distinct_ranks(8) == (0, 7)
    env = rank_environ({"PATH": "/bin", "RANK": "5"}, 9, 16, 8, "fsdp2-w16")
    assert env["RANK"] == "9" and env["WORLD_SIZE"] == "16"
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("1", "8", "1")
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["PATH"] == "/bin"
    assert WorldSpec(("fsdp2",), 16, 4, 4).name == "fsdp2-b16-w4"
    assert rank_of(Trial((), None, "/a/fsdp2-w4/rank3", 0)) == 3


def test_the_ranks_runner_runs_rank_0_and_the_last_each_with_its_environment(tmp_path, monkeypatch):
    from gpu_mem_track.advisor import world
    from gpu_mem_track.advisor.trials import SubprocessRunner

    seen, environs = [], []

    def run_forked(argv, cwd, log, environ):
        seen.append((environ["RANK"], environ["WORLD_SIZE"], environ["LOCAL_RANK"], argv[-1]))
        environs.append(environ)
        return 0

    monkeypatch.setattr(world, "run_forked", run_forked)
    monkeypatch.setenv("RANK", "1")  # fit itself under torchrun: not passed on
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))  # torchrun's for fit
    monkeypatch.setenv("ROLE_RANK", "1")
    runner = RanksRunner(SubprocessRunner("train.py", (), "A100-40GB", tmp_path))
    trial = runner(WorldSpec((), None, 4, 4))
    assert sorted(seen) == [("0", "4", "0", "train.py"), ("3", "4", "3", "train.py")]
    assert not any("TORCHELASTIC_ERROR_FILE" in env or "ROLE_RANK" in env for env in environs)
    assert not trial.completed and "no run description" in trial.error


def test_a_tight_fit_as_it_is_gives_way_to_a_sharding_that_fits_under_the_threshold(tmp_path):
    fake = FakeRanks(states=30 * GIB, activations=7 * GIB)  # 37 GiB: above 0.9 x 40
    result = fit(tmp_path, fake, nproc=4)
    assert result.rows[0].row.fits == "tight"
    assert result.answer.startswith("fits on 4 x A100-40GB with zero")  # the cheapest that fits
    assert result.exit_code == 0


def test_gradient_accumulation_makes_up_for_a_smaller_batch_per_gpu(tmp_path):
    # 150 GiB of activations at batch 8: not even fsdp2 + fsdp2-bf16 + checkpoint fits
    # (15 + 1 + 150 / 4 x 2 / 3 = 41 GiB)
    fake = FakeRanks(states=60 * GIB, activations=150 * GIB)
    args = ("--batch_size=8", "--accum=2")
    result = fit(tmp_path, fake, args, nproc=4, batch_arg="--batch_size", accum_arg="--accum")
    [fsdp2] = [r.row for r in result.rows if r.row.label == "fsdp2"]
    assert fsdp2.fits == "no" and fsdp2.batch.batch == 1  # 15 + 1 + 150 / 8 <= 40 GiB
    accumulated = result.rows[-1]
    assert accumulated.row.label == "fsdp2 at batch 1 x 8 accumulation (--accum=16)"
    assert accumulated.accum == 16 and accumulated.row.fits == "yes"  # 15 + 1 + 18.75 GiB
    assert [s for s in fake.specs if s.accum is not None] == [WorldSpec(("fsdp2",), 1, 4, 4, 16)]
    assert result.answer.startswith("fits on 4 x A100-40GB with fsdp2 at batch 1 x 8 accumulation")
    assert result.exit_code == 3  # only at a smaller batch per GPU


def test_the_accumulation_argument_needs_the_batch_argument(tmp_path):
    with pytest.raises(UsageError, match="--accum-arg needs --batch-arg"):
        fit(tmp_path, FakeRanks(GIB, GIB), ("--accum=2",), nproc=2, accum_arg="--accum")


def test_fit_for_one_gpu_refuses_a_distributed_lever():
    from gpu_mem_track.advisor.plan import parse_levers

    with pytest.raises(UsageError, match="--levers zero: a distributed lever, which fit --nproc-per-node"):
        parse_levers("expandable,zero")


@pytest.mark.parametrize("options", [[], ["--nproc-per-node", "2"]])
def test_under_torchrun_a_rank_other_than_0_runs_no_trial_and_prints_nothing(
    tmp_path, monkeypatch, capsys, options
):
    from gpu_mem_track.advisor import api, distributed
    from gpu_mem_track.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("a rank other than 0 ran trials")

    monkeypatch.setattr(distributed, "fit_distributed", refuse)
    monkeypatch.setattr(api, "fit", refuse)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert main(["fit", *options, "--out-dir", str(tmp_path / "r"), "A100-40GB", str(script)]) == 0
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "r").exists()


def test_under_torchrun_rank_0_takes_the_world_size_from_the_launch(tmp_path, monkeypatch):
    from gpu_mem_track.advisor import distributed
    from gpu_mem_track.cli import main

    asked = []

    def fake(script, args, **options):
        asked.append(options["nproc"])
        return fit(tmp_path, FakeRanks(states=GIB, activations=GIB), nproc=options["nproc"])

    monkeypatch.setattr(distributed, "fit_distributed", fake)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert main(["fit", "--out-dir", str(tmp_path), "A100-40GB", str(script)]) == 0
    assert asked == [4]


def test_the_page_says_what_the_text_says_with_the_recommended_row_in_bold(tmp_path):
    from gpu_mem_track.advisor.worldpage import render_distributed_page
    from gpu_mem_track.advisor.worldrender import verdict_lines

    # on 2: 38 + 1 GiB of states and any activations: nothing fits, with any combination
    fake = FakeRanks(states=76 * GIB, activations=10 * GIB)
    script = tmp_path / "<b>train&.py"
    script.write_text("pass\n")
    result = fit_distributed(script, (), gpu="A100-40GB", runner=fake, out_dir=tmp_path, jobs=4, nproc=2)
    assert result.answer == "fits on 4 x A100-40GB with fsdp2; not on 2"
    page = render_distributed_page(result)
    text = render_distributed(result)
    for line in verdict_lines(result):  # the sentence and the world sizes, in both
        assert line in text and f"<p>{html.escape(line)}</p>" in page
    assert "<title>gpu_mem_track fit: &lt;b&gt;train&amp;.py on 2 x A100-40GB</title>" in page
    assert "<b>train" not in page  # the script's name is escaped everywhere
    [recommended] = [row for row in page.split("<tr") if row.startswith(" class='recommended'")]
    assert ">fsdp2<" in recommended and ">4<" in recommended  # the row the answer names: 4 ranks
    best = result.rows[result.recommended].row
    assert best.label == "fsdp2" and result.rows[result.recommended].world == 4
    assert f"<td class='num'>{format_bytes(best.reserved_peak)}</td>" in recommended  # per GPU
    assert html.escape(result.launch[0]) in page and "Launch and lines to write" in page
    assert "NCCL&#x27;s own memory" in page
    assert "<style>" in page and "<script" not in page
    assert page.count("<tr") == 1 + len(result.rows)


def test_fit_nproc_per_node_writes_its_page_with_html(tmp_path, monkeypatch, capsys):
    from gpu_mem_track.advisor import distributed
    from gpu_mem_track.cli import main

    def fake(script, args, **options):
        return fit(tmp_path, FakeRanks(states=60 * GIB, activations=10 * GIB), nproc=options["nproc"])

    monkeypatch.setattr(distributed, "fit_distributed", fake)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    out = tmp_path / "fit.html"
    command = ["fit", "--nproc-per-node", "4", "--html", str(out), "A100-40GB", str(script)]
    assert main(command) == 0
    printed = capsys.readouterr()
    assert "Answer: fits on 4 x A100-40GB with fsdp2; not on 2" in printed.out
    assert f"Wrote {out}" in printed.err
    assert "<p>Answer: fits on 4 x A100-40GB with fsdp2; not on 2</p>" in out.read_text(encoding="utf-8")


class FakeSingleGpuScript(FakeRanks):
    """A script with no process group: the fsdp2 lever's change starts one."""

    def note(self, name: str) -> LeverNote:
        note = super().note(name)
        if name == "fsdp2":
            return replace(note, change=f"dist.init_process_group('nccl'); {note.change}")
        return note


def test_the_launch_lines_start_the_process_group_once(tmp_path):
    result = fit(tmp_path, FakeSingleGpuScript(states=60 * GIB, activations=10 * GIB), nproc=4)
    assert result.launch[1].startswith("import os, torch.distributed as dist; dist.init_process_group(")
    assert sum("init_process_group" in line for line in result.launch) == 1
    assert result.launch[-2:] == ("for block in model.h: fully_shard(block)", "fully_shard(model)")


class FailsAtSomeWorlds(FakeRanks):
    """``FakeRanks`` whose script raises (as nanoGPT's assertion that the accumulation
    steps divide by the world size does) at the world sizes ``failing``."""

    def __init__(self, failing: set[int], **sizes: int) -> None:
        super().__init__(**sizes)
        self.failing = failing

    def __call__(self, spec: WorldSpec) -> Trial:
        trial = super().__call__(spec)
        if spec.world not in self.failing:
            return trial
        with self.lock:
            self.specs.append(spec)
        why = f"AssertionError: 8 does not divide by {spec.world} (train.py:12)"
        return Trial(spec.levers, spec.batch, f"/s/{spec.name}/rank0", 1, GIB, GIB, "train.py:3", error=why)


def test_a_world_that_failed_for_another_reason_leaves_the_search_which_goes_on(tmp_path):
    # fsdp2: 320 / w + 1 + 10 GiB: no on 8 (51), yes on 16 (31); 32 and 64 raise. The
    # bisection over 16, 32, 64 tries 32 first; counting its failure as "does not fit"
    # went on to 64 only, and never tried 16.
    fake = FailsAtSomeWorlds({32, 64}, states=320 * GIB, activations=10 * GIB)
    result = fit(tmp_path, fake, nproc=8)
    assert dict(result.worlds) == {8: "no", 16: "yes", 32: "failed", 64: "failed"}
    assert result.world == 16
    why = "AssertionError: 8 does not divide by {} (train.py:12)"
    assert result.world_failures == ((32, why.format(32)), (64, why.format(64)))
    assert result.answer == (
        f"fits on 16 x A100-40GB with fsdp2; not on 8; failed on 32 (not memory: {why.format(32)}); "
        f"failed on 64 (not memory: {why.format(64)})"
    )
    text = render_distributed(result)
    assert (
        f"World sizes tried with fsdp2: 8: no, 16: yes, 32: failed ({why.format(32)}), 64: failed (" in text
    )
    assert result.launch[0].startswith("torchrun --nproc-per-node 8 --nnodes 2 ")
    from gpu_mem_track.advisor.worldpage import render_distributed_page

    page = render_distributed_page(result)
    assert html.escape(f"32: failed ({why.format(32)})") in page
    assert html.escape(f"failed on 64 (not memory: {why.format(64)})") in page
    assert result.exit_code == 0
    assert json.loads(json.dumps(result.to_dict()))["world_failures"][0] == [32, why.format(32)]


def test_a_failed_world_below_is_skipped_too_and_nothing_else_counts_as_tried(tmp_path):
    # fsdp2 fits on 4 (15 + 1 + 10 GiB) but not on 2; 2 raises. Bisection below 4: 1, 2.
    fake = FailsAtSomeWorlds({2}, states=60 * GIB, activations=10 * GIB)
    result = fit(tmp_path, fake, nproc=4)
    assert dict(result.worlds) == {1: "no", 2: "failed", 4: "yes"}
    assert result.world == 4
    assert result.answer.startswith("fits on 4 x A100-40GB with fsdp2; not on 1; failed on 2 (not memory: ")


def test_when_nothing_fits_the_answer_names_the_failed_worlds_apart(tmp_path):
    fake = FailsAtSomeWorlds({16, 32, 64}, states=GIB, activations=300 * GIB)
    result = fit(tmp_path, fake, nproc=4)
    assert result.world is None and result.exit_code == 1
    assert result.answer.startswith("does not fit on 4, 8 x A100-40GB with what was tried; failed on 16 (")
    assert {w for w, _ in result.world_failures} == {16, 32, 64}


def test_the_failed_worlds_reason_is_the_exception_and_the_scripts_line(tmp_path, monkeypatch):
    from gpu_mem_track.advisor import world
    from gpu_mem_track.advisor.trials import SubprocessRunner, raised_in

    log = tmp_path / "x.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/a/train.py", line 5, in <module>\n'
        "    main()\n"
        '  File "/a/train.py", line 3, in main\n'
        "    torch.ones(-1)\n"
        '  File "/usr/lib/torch/functional.py", line 90, in ones\n'
        "           ^^^^\n"
        "RuntimeError: negative dimension -1\n"
        "  more detail\n"
        "gpu_mem_track: /a/train.py exited with 1 after 0.0 s\n"
    )
    assert raised_in(log, "/a/train.py") == "RuntimeError: negative dimension -1 (train.py:3)"
    assert raised_in(log) == "RuntimeError: negative dimension -1 (functional.py:90)"
    assert raised_in(tmp_path / "missing.log") == ""

    def run_forked(argv, cwd, log, environ):  # a run that ended with the script's exception
        log.write_text(
            f'Traceback (most recent call last):\n  File "train.py", line 7, in <module>\n'
            f"AssertionError: {environ['WORLD_SIZE']}\n"
        )
        return 1

    monkeypatch.setattr(world, "run_forked", run_forked)
    monkeypatch.setattr(
        world,
        "read_trial",
        lambda folder, levers, batch, code: Trial(levers, batch, str(folder), 1, error="exit 1"),
    )
    trial = RanksRunner(SubprocessRunner("train.py", (), "A100-40GB", tmp_path))(WorldSpec((), None, 32, 8))
    assert trial.error == "AssertionError: 32 (train.py:7)"


def combinations(fake: FakeRanks) -> list[tuple[str, ...]]:
    """The levers of the trials that combined a sharding with a single-GPU lever."""
    return [s.levers for s in fake.specs if {"autocast", "checkpoint"} & set(s.levers)]


def test_when_no_sharding_fits_the_best_one_is_combined_with_autocast_and_checkpoint(tmp_path):
    # 112 GiB of states, 30 of activations on 4: fsdp2 28 + 1 + 30 GiB does not fit;
    # the sharding rows are alike but fsdp2-bf16 (a third of the activations off), the
    # most headroom: 28 + 1 + 20 = 49 GiB, still no.
    fake = FakeRanks(states=112 * GIB, activations=30 * GIB, low_precision=True)
    result = fit(tmp_path, fake, nproc=4)
    # no autocast with fsdp2-bf16; checkpoint with fsdp2 too, which keeps the numbers
    assert combinations(fake) == [("fsdp2", "checkpoint"), ("fsdp2", "fsdp2-bf16", "checkpoint")]
    rows = {r.row.label: r for r in result.rows}
    assert rows["fsdp2 + fsdp2-bf16"].row.fits == "no"
    assert rows["fsdp2 + checkpoint"].row.fits == "tight"  # 28 + 1 + 30 / 4 = 36.5 GiB
    combined = rows["fsdp2 + fsdp2-bf16 + checkpoint"]  # 28 + 1 + 30 / 4 x 2 / 3 = 34 GiB
    assert combined.row.fits == "yes" and combined.world == 4 and combined.rank == 3
    assert "checkpoint words" in combined.row.cost and "fsdp2 words" in combined.row.cost
    assert dict(result.not_applied)["fsdp2 + fsdp2-bf16 + autocast"].startswith("fsdp2-bf16 computes the")
    assert result.rows[result.recommended] is combined
    assert result.answer.startswith("fits on 4 x A100-40GB with fsdp2 + fsdp2-bf16 + checkpoint")
    assert result.answer.endswith("; with fsdp2 alone from 32 GPUs")  # 3.5 + 1 + 30; on 16: 38 GiB
    assert dict(result.worlds) == {4: "no", 16: "tight", 32: "yes"}
    assert "for block in model.h: fully_shard(block)" in result.launch
    assert "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)" in result.launch
    assert result.exit_code == 0


def test_checkpoint_with_a_sharding_that_keeps_the_numbers_is_recommended_where_it_fits(tmp_path):
    # fsdp2 on 4: 28 + 1 + 20 GiB, no; fsdp2-bf16 28 + 1 + 13.3, no (the most headroom);
    # fsdp2 + checkpoint 28 + 1 + 5 = 34 GiB fits, as fsdp2-bf16 + checkpoint's 32.3 does
    fake = FakeRanks(states=112 * GIB, activations=20 * GIB, low_precision=True)
    result = fit(tmp_path, fake, nproc=4)
    fits = {r.row.label: r.row.fits for r in result.rows}
    assert fits["fsdp2 + checkpoint"] == fits["fsdp2 + fsdp2-bf16 + checkpoint"] == "yes"
    assert result.rows[result.recommended].row.label == "fsdp2 + checkpoint"
    assert result.answer.startswith("fits on 4 x A100-40GB with fsdp2 + checkpoint")


class NoBf16Option(FakeRanks):
    """A model where ``fsdp2-bf16`` does not apply (so ``fsdp2`` is the best sharding)."""

    def note(self, name: str) -> LeverNote:
        if name == "fsdp2-bf16":
            return LeverNote(name, False, "stands for a reason")
        return super().note(name)


def test_autocast_that_does_not_apply_with_the_sharding_is_no_row_but_says_why(tmp_path):
    fake = NoBf16Option(states=60 * GIB, activations=60 * GIB, low_precision=True)
    result = fit(tmp_path, fake, nproc=4)
    assert sorted(combinations(fake)) == [("fsdp2", "autocast"), ("fsdp2", "checkpoint")]  # side by side
    labels = [r.row.label for r in result.rows]
    assert "fsdp2 + autocast" not in labels and "fsdp2 + checkpoint" in labels
    why = dict(result.not_applied)["fsdp2 + autocast"]
    assert why == "autocast: the script already autocasts (bfloat16): autocast changes nothing"
    assert result.answer.startswith("fits on 4 x A100-40GB with fsdp2 + checkpoint")  # 15 + 1 + 15
    assert f"Not tried: fsdp2 + autocast: {why}" in render_distributed(result)


def test_both_activation_levers_together_when_neither_fits_alone(tmp_path):
    # fsdp2 on 4: 16 + 100 GiB; + autocast 16 + 50; + checkpoint 16 + 25; + both 16 + 12.5
    fake = NoBf16Option(states=60 * GIB, activations=100 * GIB)
    result = fit(tmp_path, fake, nproc=4)
    assert sorted(combinations(fake)) == [
        ("fsdp2", "autocast"),
        ("fsdp2", "autocast", "checkpoint"),
        ("fsdp2", "checkpoint"),
    ]
    fits = {r.row.label: r.row.fits for r in result.rows}
    assert fits["fsdp2 + autocast"] == fits["fsdp2 + checkpoint"] == "no"
    assert fits["fsdp2 + autocast + checkpoint"] == "yes"
    assert result.answer.startswith("fits on 4 x A100-40GB with fsdp2 + autocast + checkpoint")


def test_a_script_that_shards_itself_is_combined_as_it_is(tmp_path):
    # shards itself: 100 / 2 + 1 + 40 GiB as it is on 2; its options alike (the fake's)
    # but fsdp2-bf16, which does not apply here; + checkpoint: 51 + 10 no; the best row
    # has the most headroom, which all share: the first, the script as it is
    class Itself(NoBf16Option):
        pass

    fake = Itself(states=40 * GIB, activations=40 * GIB, shards_itself=True)
    result = fit(tmp_path, fake, nproc=2)  # 20 + 1 + 40 GiB
    assert sorted(combinations(fake))[:2] == [("autocast",), ("checkpoint",)]
    assert result.answer.startswith("fits on 2 x A100-40GB with checkpoint")  # 21 + 10


def test_fit_distributed_takes_fits_keywords_and_passes_them_to_every_ranks_run(tmp_path, monkeypatch):
    import inspect

    import gpu_mem_track.advisor as advisor
    from gpu_mem_track.advisor import world

    single = set(inspect.signature(advisor.fit).parameters) - {"levers"}  # the levers: fit_distributed's own
    assert single <= set(inspect.signature(advisor.fit_distributed).parameters)
    argvs = []

    def run_forked(argv, cwd, log, environ):
        argvs.append(argv)
        return 1

    monkeypatch.setattr(world, "run_forked", run_forked)
    monkeypatch.setenv("GPU_MEM_TRACK_FIT_PRELOAD", "off")
    script, extra = tmp_path / "train.py", tmp_path / "model.py"
    script.write_text("pass\n")
    extra.write_text("pass\n")
    result = advisor.fit_distributed(
        script,
        ["--lr=1"],
        gpu="A100-40GB",
        nproc=2,
        out_dir=tmp_path,
        include=[str(extra)],
        max_iterations=3,
        max_seconds=9.5,
        run_to_end=True,
        end_script=True,
        engine="settrace",
    )
    assert result.verdict == "failed" and len(argvs) == 2  # the baseline's two ranks, which wrote nothing
    for argv in argvs:
        options = argv[argv.index("--run-name") + 2 : argv.index("--")]
        assert options == [
            "--include",
            str(extra),
            "--max-iterations",
            "3",
            "--max-seconds",
            "9.5",
            "--run-to-end",
            "--end-script",
            "--engine",
            "settrace",
        ]
        assert argv[argv.index("--") :] == ["--", str(script), "--lr=1"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_iterations": 0}, "--max-iterations must be at least 1"),
        ({"max_seconds": 0}, "--max-seconds must be above 0"),
        ({"include": ["no_such_module_here"]}, "no_such_module_here"),
        ({"jobs": 0}, "--jobs takes a count >= 1"),
        ({"max_batch": 0}, "--max-batch takes a count >= 1"),
    ],
)
def test_fit_distributed_refuses_a_bad_option_before_any_trial(tmp_path, options, message):
    fake = FakeRanks(GIB, GIB)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    with pytest.raises(UsageError, match=message):
        fit_distributed(script, gpu="A100-40GB", nproc=2, runner=fake, out_dir=tmp_path, **options)
    assert fake.specs == []


def test_fit_distributed_no_longer_takes_run_options(tmp_path):
    with pytest.raises(TypeError, match="run_options"):
        fit(tmp_path, FakeRanks(GIB, GIB), nproc=2, run_options=["--run-to-end"])


def test_fit_nproc_per_node_passes_the_trial_options_as_keywords(tmp_path, monkeypatch):
    from gpu_mem_track.advisor import distributed
    from gpu_mem_track.cli import main

    asked = {}

    def fake(script, args, **options):
        asked.update(options)
        return fit(tmp_path, FakeRanks(states=GIB, activations=GIB), nproc=options["nproc"])

    monkeypatch.setattr(distributed, "fit_distributed", fake)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    command = ["fit", "--nproc-per-node", "2", "--max-iterations", "4", "--max-seconds", "30", "--run-to-end"]
    command += ["--end-script", "--engine", "settrace", "--include", "x.py", "A100-40GB", str(script)]
    assert main(command) == 0
    assert "run_options" not in asked
    assert (asked["max_iterations"], asked["max_seconds"], asked["engine"]) == (4, 30.0, "settrace")
    assert asked["run_to_end"] is asked["end_script"] is True and asked["include"] == ("x.py",)
