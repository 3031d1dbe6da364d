"""Loops left alone (runner/steady.py): an evaluation loop once steady, whatever its passes;
an inner loop steady before its 64th pass, as a ``break`` (the loop around it runs its
step and becomes the watched loop); a loop left before, each time it is entered again and
steady again; and what ``StopInfo`` says of loops left more than once. Small plain-torch
scripts under the simulated GPU (their own prints count the iterations that ran), and the
rule's corner cases on loops that count into a dict."""

from __future__ import annotations

import sys
from pathlib import Path

from test_steady_gpu_work import run_watched, simulate

from gpu_mem_track.runner.steady import StopRule

#: nanoGPT's shape in plain torch: an evaluation of two splits (under no_grad) every 3
#: steps, 16 micro-steps of gradient accumulation per optimizer step (AdamW: its state is
#: allocated at the first step), a while loop ended by its own break.
TRAINING = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64)).to("cuda")
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(32, 64, device="cuda")
counts = {"eval": [], "micro": [], "steps": 0}


@torch.no_grad()
def estimate_loss():
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(100)
        done = 0
        for k in range(100):  # line 16: the evaluation loop
            losses[k] = model(x).pow(2).mean().item()
            done += 1
        counts["eval"].append(done)
        out[split] = losses.mean()
    return out


iter_num = 0
while True:  # line 25: the training loop
    if iter_num % 3 == 0:
        estimate_loss()
    done = 0
    for micro in range(16):  # line 29: the micro-steps
        (model(x).pow(2).mean() / 16).backward()
        done += 1
    counts["micro"].append(done)
    opt.step()
    opt.zero_grad(set_to_none=True)
    counts["steps"] += 1
    iter_num += 1
    if iter_num >= MAX_STEPS:
        break
print("eval", counts["eval"])
print("micro", counts["micro"])
print("steps", counts["steps"], "max allocated", torch.cuda.max_memory_allocated())
"""


def write(tmp_path: Path, max_steps: int) -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAINING.lstrip().replace("MAX_STEPS", str(max_steps)))
    return script


def test_evaluation_and_micro_steps_are_left_alone_each_time_and_the_step_loop_once_steady(tmp_path):
    script = write(tmp_path, 10**6)
    out, meta = simulate(tmp_path, script)
    lines = out.splitlines()
    # (a) the evaluation loop does not wait for 64 passes: 4 batches (2 of warm-up, 2
    # unchanged) of 100, then left as a break: the split's loss and the 'val' split ran;
    # (b) left again in the 'val' split and at the next evaluation (step 3), each entry
    # after 1 batch of warm-up and 1 unchanged (the first with the optimizer's state: 3)
    assert lines[0] == "eval [4, 2, 3, 2]"
    # (c) the micro-steps are left alone once steady, every step: the optimizer step and
    # zero_grad ran after each; the step loop was left once its own steps were steady (the
    # evaluation at step 3, the first with the optimizer's state, raised its lines' peaks:
    # steps 4 and 5 unchanged)
    assert lines[1] == f"micro {[4, 3, 2, 2, 2, 2]}"
    assert lines[2].startswith("steps 6 max allocated ")
    stop = meta["stopped"]
    assert stop["action"] == "left-loop" and stop["loop"].endswith("train.py:16")
    assert stop["iterations"] == 4 and stop["skipped"] == 96 and stop["resumed"].endswith("train.py:19")
    assert [where.rsplit(":", 1)[1] for where in stop["left"]] == ["29", "25"]
    # (d) each loop left more than once, once, with what its leaves skipped in all
    assert stop["repeats"] == [
        f"{script}:16 4 times, {96 + 98 + 97 + 98} iteration(s) skipped in all",
        f"{script}:29 6 times, {12 + 13 + 4 * 14} iteration(s) skipped in all",
    ]


def test_the_peak_is_the_one_of_running_every_iteration(tmp_path):
    # 5 steps of 16 micro-steps, evaluations of 100 batches at steps 0 and 3, all of it
    # run (--run-to-end), against the same script with its loops left alone once steady
    script = write(tmp_path, 5)
    left_out, left = simulate(tmp_path, script)
    end_out, end = simulate(tmp_path, script, flags=("--run-to-end",))
    assert end_out.splitlines()[:2] == ["eval [100, 100, 100, 100]", f"micro {[16] * 5}"]
    # the step loop ended on its own (5 steps: too few to be left), its loops were cut
    # the loops left before are left after 1 pass of warm-up and 1 unchanged when entered again
    assert left_out.splitlines()[:2] == ["eval [4, 2, 3, 2]", f"micro {[4, 3, 2, 2, 2]}"]
    assert (left["peak"], left["reserved_peak"]) == (end["peak"], end["reserved_peak"])
    assert left_out.splitlines()[2] == end_out.splitlines()[2]  # the script's own figure


COUNTING = """
def main(gpu):
    gpu["runs"] = []
    for step in range(50):
        done = 0
        for micro in range(200):
            gpu["events"] += 2
            done += 1
        gpu["runs"].append(done)
        if step == 0:
            gpu["peak"] += 1  # the optimizer's state
    gpu["after"] = True
"""


def test_max_iterations_cuts_the_inner_loop_alone_and_counts_the_outer_loop(tmp_path):
    gpu, watch = run_watched(tmp_path, COUNTING, StopRule(until_steady=False, max_iterations=3))
    # 3 micro-steps per step, 3 steps: the step loop is the watched loop once the inner
    # loop was left alone
    assert gpu["runs"] == [3, 3, 3] and gpu["after"]
    stop = watch.stopped
    assert stop.reason == "max-iterations" and stop.loop.endswith("script.py:6") and stop.skipped == 197
    assert [where.rsplit(":", 1)[1] for where in stop.left] == ["4"]
    assert stop.repeats == (f"{tmp_path / 'script.py'}:6 3 times, {3 * 197} iteration(s) skipped in all",)


def test_max_iterations_on_an_inner_loops_last_pass_lets_it_end_and_counts_the_outer_loop(tmp_path):
    # 3 micro-steps, --max-iterations 3: the third is the last, so nothing is left; the
    # step loop goes on and is left after 3 steps, as with more micro-steps
    gpu, watch = run_watched(
        tmp_path, COUNTING.replace("range(200)", "range(3)"), StopRule(until_steady=False, max_iterations=3)
    )
    assert gpu["runs"] == [3, 3, 3] and gpu["after"]
    assert watch.stopped.reason == "max-iterations" and watch.stopped.loop.endswith("script.py:4")


def test_end_script_never_stops_an_inner_loop_before_its_64th_pass(tmp_path):
    gpu, watch = run_watched(tmp_path, COUNTING, StopRule(leave_loop=False))
    assert gpu["runs"] == [] and "after" not in gpu  # ended in the first step's micro-steps
    assert watch.stopped.action == "ended-script" and watch.stopped.iterations == 64


def test_an_inner_loop_ending_the_outer_body_is_left_with_it_at_its_64th_pass(tmp_path):
    # its break would leave the step loop too: no break leaves it alone, so the rule is the
    # one of before (64 passes, then both loops)
    source = """
    def main(gpu):
        gpu["micro"] = 0
        for step in range(50):
            gpu["peak"] += 1 if step == 0 else 0
            for micro in range(200):
                gpu["events"] += 2
                gpu["micro"] += 1
        gpu["after"] = True
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["micro"] == 64 and gpu["after"]
    assert watch.stopped.loop.endswith("script.py:6") and watch.stopped.repeats == ()


def test_a_short_inner_loop_steady_at_its_last_pass_runs_to_its_end(tmp_path):
    # nothing left to skip: not a leave, and the loop stays part of the step loop's
    # iterations (nanoGPT with 4 micro-steps)
    source = """
    def main(gpu):
        gpu["runs"] = []
        for step in range(50):
            done = 0
            for micro in range(4):
                gpu["events"] += 2
                done += 1
            gpu["runs"].append(done)
        gpu["after"] = True
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["runs"] == [4] * 4 and gpu["after"]
    stop = watch.stopped
    assert stop.loop.endswith("script.py:4") and stop.skipped == 46 and stop.left == () and stop.repeats == ()


def test_an_unpadded_loop_ending_its_function_runs_on_when_it_cannot_be_left_alone(tmp_path):
    # a file the runner did not compile (an --include'd module): no line after the loop
    # to land on, so it runs on to its 64th pass (once: it is not tried again each pass),
    # then the script is ended there as before
    source = """
    def evaluate(gpu):
        for batch in range(200):
            gpu["events"] += 2
            gpu["batches"] += 1

    def main(gpu):
        gpu["batches"] = 0
        for epoch in range(3):
            evaluate(gpu)
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["batches"] == 64
    assert watch.stopped.action == "ended-script" and "did not compile" in watch.stopped.note


def test_leaving_a_loop_keeps_no_local_alive_that_the_function_drops(tmp_path):
    # counting the iterations left must not keep a copy of the function's locals: before
    # 3.13 frame.f_locals is such a copy, and it kept nanoGPT's last evaluation logits
    # allocated through the next split's batches (3 GiB more at batch 32 on the GPU)
    source = """
    import weakref

    class Output:
        pass

    def evaluate(gpu, n):
        for k in range(n):
            gpu["events"] += 2
            out = Output()
        last = weakref.ref(out)
        out = Output()  # the next batch's output: the last one is dropped
        gpu["dropped"] = last() is None

    def main(gpu):
        evaluate(gpu, 200)
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["dropped"] is True
    stop = watch.stopped
    assert stop.action == "left-loop" and stop.iterations == 4
    assert stop.skipped == (196 if sys.version_info >= (3, 13) else None)  # n is a local
