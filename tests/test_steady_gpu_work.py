"""Which loops the stop rule may leave (runner/steady.py): only a loop whose iterations
work on the GPU (the allocator's event count moves in each), whose highest memory at the
header stopped rising and whose peaks stopped rising; never a loop in a constructor or a ``forward``.
Model-building, data-preparation and configuration loops run whole, so the script after
them sees the model and the data it built (the bug: ResNet-50's ``__init__`` loop was
judged steady under ``run --simulate`` and the model was built with its loop cut short)."""

from __future__ import annotations

import json
from pathlib import Path

from watched import ROOT, Sink, cli, run_main

from gpu_mem_track.runner.steady import LoopWatch, StopRule


def run_watched(
    tmp_path: Path, source: str, rule: StopRule, activity: bool = True, grad: bool = False
) -> tuple[dict, LoopWatch]:
    """Run ``source``'s ``main(gpu)`` under a watch; ``gpu`` is a dict the code sets:
    ``allocated``, ``events`` and ``ooms`` (what ``activity`` reads), ``peak`` (the high mark),
    and with ``grad`` ``grad`` (whether autograd is on, ``True`` at the start, what the
    watch's ``grad_enabled`` reads)."""
    gpu = {"allocated": 0, "events": 0, "peak": 0, "ooms": 0}
    reading = (lambda: (gpu["allocated"], gpu["events"], gpu["ooms"])) if activity else None
    if grad:
        gpu["grad"] = True
    grad_enabled = (lambda: gpu["grad"]) if grad else None
    watch = LoopWatch(Sink(), rule, lambda: gpu["peak"], activity=reading, grad_enabled=grad_enabled)
    run_main(tmp_path, source, watch, gpu)
    return gpu, watch


LOOPS = """
def main(gpu):
    gpu["built"] = 0
    for layer in range(200):          # builds on the CPU: no GPU work
        gpu["built"] += 1
    gpu["trained"] = 0
    for step in range(200):           # a step: allocates and frees
        gpu["events"] += 2
        gpu["trained"] += 1
    gpu["after"] = True
"""


def test_a_loop_without_gpu_work_runs_whole_and_the_training_loop_is_left(tmp_path):
    gpu, watch = run_watched(tmp_path, LOOPS, StopRule())
    assert gpu["built"] == 200
    # counted from the loop's entry: 2 of warm-up and 2 unchanged, left at the 5th header
    assert gpu["trained"] == 4 and gpu["after"]
    assert watch.stopped.action == "left-loop" and watch.stopped.loop.endswith("script.py:7")


def test_without_an_event_count_every_iteration_counts(tmp_path):
    # a sampler that counts nothing (the process RSS): the rule as before, on the first loop
    gpu, watch = run_watched(tmp_path, LOOPS, StopRule(), activity=False)
    assert gpu["built"] == 4 and watch.stopped.loop.endswith("script.py:4")


def test_max_iterations_counts_only_iterations_that_worked_on_the_gpu(tmp_path):
    gpu, watch = run_watched(tmp_path, LOOPS, StopRule(until_steady=False, max_iterations=10))
    assert gpu["built"] == 200 and gpu["trained"] == 10
    assert watch.stopped.reason == "max-iterations" and watch.stopped.loop.endswith("script.py:7")


def test_memory_growing_at_the_header_is_not_steady(tmp_path):
    # layers built on the GPU one per iteration, below an earlier peak: no peak rises,
    # events move, but the memory at the header grows, so the loop runs whole
    source = """
    def main(gpu):
        gpu["peak"] = 10**9
        gpu["built"] = 0
        for layer in range(100):
            gpu["events"] += 1
            gpu["allocated"] += 4096
            gpu["built"] += 1
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["built"] == 100 and watch.stopped is None


def test_batches_of_varying_sizes_are_steady_once_the_largest_was_seen(tmp_path):
    # the memory at the header goes up and down with the batch; its high stops rising
    source = """
    def main(gpu):
        gpu["steps"] = 0
        for step in range(1000):
            gpu["events"] += 2
            gpu["allocated"] = 4096 * (1 + step % 3)
            gpu["steps"] += 1
        gpu["after"] = True
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["after"] and gpu["steps"] == 5  # highs at 1-3 (sizes 1, 2, 3), then 2 unchanged
    assert watch.stopped.action == "left-loop"


def test_a_loop_called_after_a_finished_loop_is_watched(tmp_path):
    # nanoGPT: the loop over the optimizer's param groups (no GPU work) ends, then the
    # same frame calls a function whose loop works on the GPU: that loop is not part of
    # the finished loop's iteration, it is the iteration
    source = """
    def train(gpu):
        for step in range(200):
            gpu["events"] += 2
            gpu["steps"] += 1
        gpu["after"] = True

    def main(gpu):
        gpu["steps"] = 0
        for group in range(2):
            gpu["lr"] = group
        train(gpu)
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["steps"] == 4 and gpu["after"] and watch.stopped.loop.endswith("script.py:3")


def test_a_constructors_loop_is_never_the_iteration(tmp_path):
    # even when its iterations work on the GPU and repeat (a layer made and freed)
    source = """
    class Model:
        def __init__(self, gpu):
            self.layers = []
            for index in range(50):
                gpu["events"] += 2
                self.layers.append(index)
            self.helper(gpu)

        def helper(self, gpu):
            for index in range(50):  # a function the constructor calls
                gpu["events"] += 2
                self.layers.append(index)

    def main(gpu):
        gpu["layers"] = len(Model(gpu).layers)
    """
    gpu, watch = run_watched(tmp_path, source, StopRule(), activity=False)
    assert gpu["layers"] == 100 and watch.stopped is None
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["layers"] == 100 and watch.stopped is None


SCRIPT = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        blocks = []
        for _ in range(depth):  # a constructor's loop
            blocks.append(nn.Linear(width, width))
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def stack(width, depth):  # a function's loop, called at module level
    layers = []
    for _ in range(depth):
        layers.append(nn.Linear(width, width))
    return nn.Sequential(*layers)


rows = []
for i in range(300):  # data prepared on the CPU
    rows.append(torch.full((4, 32), float(i)))
data = torch.stack(rows)
net = Net(32, 40).to("cuda")
head = stack(32, 30).to("cuda")
print("rows", len(rows), "batch", [len(row) for row in rows[:3]])
print("params", sum(p.numel() for p in (*net.parameters(), *head.parameters())))
opt = torch.optim.SGD([*net.parameters(), *head.parameters()], lr=0.1)
for step in range(1000):  # line 35: the training loop
    opt.zero_grad()
    loss = head(net(data[step % 300].cuda())).sum()
    loss.backward()
    opt.step()
print("after training", step)
"""


def simulate(tmp_path: Path, script: Path, *args: str, flags: tuple[str, ...] = ()) -> tuple[str, dict]:
    """``run --simulate h200`` of ``script`` in a subprocess: its stdout and meta.json."""
    out = tmp_path / "reports" / ("-".join(flags) or "default")
    done = cli(tmp_path, "run", "--simulate", "h200", *flags, "--out-dir", str(out), str(script), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(next(out.glob("*/meta.json")).read_text())


def test_a_model_built_in_loops_is_built_whole_under_simulate(tmp_path):
    script = tmp_path / "build.py"
    script.write_text(SCRIPT.lstrip())
    stdout, meta = simulate(tmp_path, script)
    lines = stdout.splitlines()
    assert lines[0] == "rows 300 batch [4, 4, 4]"
    assert lines[1] == f"params {(40 + 30) * (32 * 32 + 32)}"  # every layer of both loops
    stop = meta["stopped"]
    assert stop["action"] == "left-loop" and stop["loop"].endswith("build.py:35")
    step = int(lines[2].split()[-1])
    assert lines[2].startswith("after training") and 3 <= step < 999 and stop["skipped"] == 999 - step


def test_resnet50_script_gives_the_same_peak_left_or_run_to_end(tmp_path):
    args = ["--batch", "2", "--size", "32", "--steps", "6"]
    script = ROOT / "scripts" / "check" / "resnet50_train.py"
    left_out, left = simulate(tmp_path, script, *args)
    end_out, end = simulate(tmp_path, script, *args, flags=("--run-to-end",))
    assert left["stopped"]["action"] == "left-loop" and left["stopped"]["loop"].endswith(
        "resnet50_train.py:95"
    )
    assert end["stopped"] is None
    assert (left["peak"], left["reserved_peak"]) == (end["peak"], end["reserved_peak"])
    assert left_out == end_out  # the script's own max_memory_allocated/reserved prints


def test_a_script_that_fails_after_a_left_loop_is_told_why_it_may(tmp_path):
    script = tmp_path / "last.py"
    script.write_text(
        "import torch\n"
        "w = torch.zeros(64, device='cuda', requires_grad=True)\n"
        "for step in range(1000):\n"
        "    (w * 2).sum().backward()\n"
        "    if step == 999:\n"
        "        final = step  # set only by the last iteration, which is skipped\n"
        "print('final', final)\n"
    )
    done = cli(tmp_path, "run", "--simulate", "h200", "--out-dir", "r", str(script))
    assert done.returncode == 1 and "NameError: name 'final' is not defined" in done.stderr
    assert (
        f"the script failed after the runner left the loop at {script}:3 (4 iteration(s) run)" in done.stderr
    )
    assert "--run-to-end runs them all" in done.stderr


def test_a_comprehension_is_not_a_loop_the_watch_leaves(tmp_path):
    source = """
    def main(gpu):
        def layer(index):
            gpu["events"] += 2
            return index

        gpu["layers"] = [
            layer(index)
            for index in range(200)
        ]
        gpu["after"] = True
    """
    gpu, watch = run_watched(tmp_path, source, StopRule())
    assert gpu["layers"] == list(range(200)) and gpu["after"] and watch.stopped is None


EVALUATING = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to("cuda")
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(16, 64, device="cuda")


@torch.no_grad()
def estimate_loss():  # nanoGPT's, with its default eval_iters
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(200)
        for k in range(200):  # line 14: the evaluation loop
            losses[k] = model(x).pow(2).mean().item()
        out[split] = losses.mean()
    return out


iter_num = 0
while True:  # line 21: the training loop
    if iter_num % 50 == 0:
        print(iter_num, sorted(estimate_loss()))
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > 100:
        break
print("trained", iter_num)
"""


def test_an_evaluation_loop_is_left_alone_and_the_training_goes_on(tmp_path):
    # nanoGPT's estimate_loss() at step 0: its batch loop (under no_grad) is left once
    # steady (an evaluation does not wait for 64 passes), in each split; its split loop and
    # the training loop around the call go on
    script = tmp_path / "evaluating.py"
    script.write_text(EVALUATING.lstrip())
    left_out, left = simulate(tmp_path, script)
    end_out, end = simulate(tmp_path, script, flags=("--run-to-end",))
    lines = left_out.splitlines()
    assert lines[0] == "0 ['train', 'val']" and lines[-1].startswith("trained ")
    assert lines[-1] == "trained 4"  # the training loop was left once steady, later
    stop = left["stopped"]
    assert stop["loop"].endswith("evaluating.py:14") and stop["iterations"] == 4 and stop["skipped"] == 196
    assert [where.rsplit(":", 1)[1] for where in stop["left"]] == ["21"]
    # train (4 batches), val (2: a loop left before, 1 of warm-up and 1 unchanged)
    assert stop["repeats"] == [f"{script}:14 2 times, 394 iteration(s) skipped in all"]
    assert end_out.splitlines()[-1] == "trained 101"
    assert (left["peak"], left["reserved_peak"]) == (end["peak"], end["reserved_peak"])


def test_without_autograd_a_left_loop_leaves_no_loop_around_it(tmp_path):
    source = """
    def evaluate(gpu):
        gpu["grad"] = False
        for batch in range(200):
            gpu["events"] += 2
            gpu["evaluated"] += 1
        gpu["grad"] = True

    def main(gpu):
        gpu["evaluated"] = 0
        for epoch in range(3):
            evaluate(gpu)
        gpu["after"] = True
    """
    gpu, watch = run_watched(tmp_path, source, StopRule(), grad=True)
    # each evaluation is left once steady (4 batches: an evaluation does not wait for 64
    # passes; 2 when entered again, a loop left before), within the epoch loop's iterations
    # too; the epoch loop around it is not left: every epoch ran (3, too few to be steady)
    assert gpu["evaluated"] == 4 + 2 * 2 and gpu["after"]
    stop = watch.stopped
    assert stop.loop == f"{tmp_path / 'script.py'}:4" and stop.left == ()
    assert stop.repeats == (
        f"{tmp_path / 'script.py'}:4 3 times, {196 + 2 * 198:,} iteration(s) skipped in all",
    )


OOM_RETRIES = """
def main(gpu):
    batch = 1024
    fits = 40
    while True:
        gpu["events"] += 2
        if batch > fits:  # ran out of memory: the script halves its batch and tries again
            gpu["ooms"] += 1
            batch //= 2
            continue
        gpu["result"] = batch
        break
"""


def test_an_iteration_that_ran_out_of_memory_is_never_steady(tmp_path):
    """A loop that catches out-of-memory and halves its batch (the same memory at its header
    each time) goes on until the batch fits; before, it was left as steady after a few
    failures, with a batch the GPU would not have needed to halve to."""
    gpu, watch = run_watched(tmp_path, OOM_RETRIES, StopRule())
    assert gpu["result"] == 32 and gpu["ooms"] == 5
    assert watch.stopped is None
