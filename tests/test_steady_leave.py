"""Leaving a loop as a ``break`` would (runner/steady.py, runner/loops.py): the code after
the loop runs, the loops around it end, the skipped iterations are counted where they
can be, and a loop that no jump can leave ends the script as before. The loops run for
real under each tracing engine this Python has; their "memory" is a list the traced code
appends to, read as the high marks."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from watched import Sink, cli, run_main

from gpu_mem_track.runner.loops import PAD_LINE, loop_table
from gpu_mem_track.runner.steady import LoopWatch, StopInfo, StopRule
from gpu_mem_track.runner.tracer import ENGINES

ENGINE_NAMES = [name for name, engine in ENGINES.items() if engine.available()]


def run_watched(tmp_path: Path, source: str, engine: str, rule: StopRule | None = None, pad: bool = False):
    """Run ``source``'s ``main(log)`` under a watch with ``engine``; the high mark is the
    number of entries in ``log`` that are not strings (strings are what the code after
    the loops writes); ``pad``: compile it as the runner does (``loops.pad_loops``).
    Returns (log, watch, sink, ended: whether StopRun ended it)."""
    log: list = []
    sink = Sink()
    watch = LoopWatch(sink, rule or StopRule(), lambda: sum(1 for x in log if not isinstance(x, str)))
    _, ended = run_main(tmp_path, source, watch, log, ENGINES[engine], pad)
    return log, watch, sink, ended


#: A loop that logs its first four steps, then the line after it (line 6).
FOUR_STEPS = """
def main(log):
    for step in range(1000):
        if step < 4:
            log.append(step)
    log.append("after the loop")
"""


@pytest.fixture(params=ENGINE_NAMES)
def engine(request):
    return request.param


def test_the_code_after_the_loop_runs_and_the_skipped_iterations_are_counted(tmp_path, engine):
    source = FOUR_STEPS + '    log.append(f"step {step}")\n'
    log, watch, sink, ended = run_watched(tmp_path, source, engine)
    assert not ended
    assert log == [0, 1, 2, 3, "after the loop", "step 5"]  # 6 iterations ran (0-5)
    info = watch.stopped
    assert info.action == "left-loop" and info.reason == "steady"
    assert info.iterations == 6 and info.skipped == 1000 - 6
    assert info.loop.endswith("script.py:3") and info.resumed.endswith("script.py:6")
    # the profiler saw the jump's target start right after the header's last pass
    assert sink.lines[-3:] == [6, 7, 7] or sink.lines[-2:] == [6, 7]


def test_a_for_else_loop_is_left_into_its_else_as_its_end_would(tmp_path, engine):
    # the skipped iterations are taken as run, so the loop ends as its own end would:
    # the else runs (a break would skip it, a GPU running every iteration would not)
    source = """
def main(log):
    for step in range(1000):
        if step < 4:
            log.append(step)
    else:
        log.append(f"else {step}")
    log.append("after the loop")
"""
    log, watch, _, ended = run_watched(tmp_path, source, engine)
    assert not ended
    assert log == [0, 1, 2, 3, "else 5", "after the loop"]
    assert watch.stopped.action == "left-loop" and watch.stopped.resumed.endswith("script.py:7")


def test_an_inner_loop_ending_a_for_else_body_goes_on_at_the_outer_else(tmp_path):
    path = tmp_path / "loops.py"
    path.write_text(
        textwrap.dedent(
            """
            for a in x:              # 2: into its else
                for b in y:          # 3: last in the body: the outer one's else
                    pass
            else:
                z = 1                # 6
            while c:                 # 7: into its else
                pass
            else:
                w = 2                # 10
            """
        )
    )
    table = loop_table(str(path))
    assert {h: loop.exit for h, loop in table.items()} == {2: 6, 3: 6, 7: 10}
    assert table[3].through == (2,) and table[2].through == ()


def test_end_script_keeps_the_old_stop(tmp_path, engine):
    log, watch, _, ended = run_watched(tmp_path, FOUR_STEPS, engine, StopRule(leave_loop=False))
    assert ended and log == [0, 1, 2, 3]
    assert watch.stopped.action == "ended-script" and watch.stopped.skipped is None


def test_nanogpt_while_true_with_an_accumulation_loop_ends(tmp_path, engine):
    # nanoGPT's shape: `while True:` ends only through its own break on the step count;
    # the gradient-accumulation loop inside it is part of each iteration.
    source = """
    def main(log):
        iter_num, max_iters = 0, 10**6
        while True:
            for micro_step in range(4):
                pass
            if iter_num == 0:
                log.append(0)  # the optimizer's state
            iter_num += 1
            if iter_num > max_iters:
                break
        log.append(f"after {iter_num}")
    """
    log, watch, _, ended = run_watched(tmp_path, source, engine)
    assert not ended
    assert log == [0, "after 4"]  # 2 iterations of warm-up, 2 unchanged
    info = watch.stopped
    assert info.loop.endswith("script.py:4") and info.skipped is None
    assert "how many is not known" in info.describe()


def test_an_inner_loop_is_left_alone_in_each_epoch_and_the_epoch_loop_once_steady(tmp_path, engine):
    # an epoch loop around a batch loop in the same function: the batch loop is left (a
    # break: the epoch's evaluation runs) once steady, in every epoch; the epoch loop is
    # the watched loop then, left once its epochs are steady
    source = """
    def main(log):
        for epoch in range(10):
            for batch in range(500):
                if batch < 3 and epoch == 0:
                    log.append(batch)
            log.append(f"evaluate {epoch}")
        log.append("after the epochs")
    """
    log, watch, _, ended = run_watched(tmp_path, source, engine)
    assert not ended
    assert log == [0, 1, 2, *(f"evaluate {epoch}" for epoch in range(4)), "after the epochs"]
    info = watch.stopped
    # 5 batches: the log grows until the third, then 2 unchanged
    assert info.loop.endswith("script.py:4") and info.iterations == 5 and info.skipped == 500 - 5
    assert info.resumed.endswith("script.py:7")
    assert [where.rsplit(":", 1)[1] for where in info.left] == ["3"]
    # epochs 1-3: 2 batches each (a loop left before: 1 of warm-up, 1 unchanged)
    assert info.repeats == (
        f"{tmp_path / 'script.py'}:4 4 times, {495 + 3 * 498:,} iteration(s) skipped in all",
    )


def test_an_inner_loop_that_ends_its_enclosing_body_leaves_both_at_once(tmp_path, engine):
    source = """
    def main(log):
        for epoch in range(10):
            log.append(f"epoch {epoch}")
            for batch in range(500):
                if batch < 3:
                    log.append(batch) if epoch == 0 else None
        log.append("after")
    """
    log, watch, _, _ = run_watched(tmp_path, source, engine)
    assert log == ["epoch 0", 0, 1, 2, "after"]
    assert [where.rsplit(":", 1)[1] for where in watch.stopped.left] == ["3"]


def test_a_loop_in_a_called_function_and_the_callers_loop(tmp_path, engine):
    # PyTorch's MNIST example: train() runs the batches, the epoch loop calls it then test()
    source = """
    class Loader:
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __iter__(self):
            return iter(range(self.n))

    def train(log, loader, epoch):
        for batch_idx, batch in enumerate(loader):
            if batch < 3 and epoch == 1:
                log.append(batch)
        return batch_idx

    def main(log):
        loader = Loader(300)
        for epoch in range(1, 15):
            last = train(log, loader, epoch)
            log.append(f"test {epoch} after batch {last}")
        log.append("saved")
    """
    log, watch, _, ended = run_watched(tmp_path, source, engine)
    assert not ended
    # train()'s batch loop is left alone (its return runs) in each epoch, once steady; the
    # epoch loop is left once its epochs are steady
    tests = [f"test {epoch} after batch {4 if epoch == 1 else 1}" for epoch in range(1, 5)]
    assert log == [0, 1, 2, *tests, "saved"]
    info = watch.stopped
    assert info.loop.endswith("script.py:11") and info.resumed.endswith("script.py:14")
    assert [where.rsplit(":", 1)[1] for where in info.left] == ["18"]
    where = f"{tmp_path / 'script.py'}:11 4 times, "
    if sys.version_info >= (3, 13):
        assert info.skipped == 300 - 5
        assert info.repeats == (f"{where}{295 + 3 * 298:,} iteration(s) skipped in all",)
    else:  # loader is train()'s local: not read before 3.13 (loops._lookup)
        assert info.skipped is None and info.repeats == (f"{where}how many skipped not known",)


def test_a_for_over_a_generator_is_left_and_the_generator_closed(tmp_path, engine):
    source = """
    def batches(log):
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            log.append("generator closed")

    def main(log):
        for batch in batches(log):
            if batch < 3:
                log.append(batch)
        log.append("after")
    """
    log, watch, _, ended = run_watched(tmp_path, source, engine)
    assert not ended
    assert log == [0, 1, 2, "generator closed", "after"]
    assert watch.stopped.loop.endswith("script.py:12") and watch.stopped.skipped is None


def test_a_loop_that_ends_its_function_is_left_through_the_runners_pad(tmp_path, engine):
    # PyTorch's MNIST example: train()'s batch loop is its last statement
    source = """
    class Closing:
        def __init__(self, log):
            self.log = log
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self.log.append("exit ran")

    def train(log):
        for step in range(1000):
            if step < 3:
                log.append(step)

    def evaluate(log):
        with Closing(log):
            for batch in range(1000):
                pass

    def main(log):
        train(log)
        log.append("tested")
        evaluate(log)
        log.append("after")
    """
    log, watch, sink, ended = run_watched(tmp_path, source, engine, pad=True)
    assert not ended
    assert log == [0, 1, 2, "tested", "exit ran", "after"]
    info = watch.stopped
    assert info.action == "left-loop" and info.skipped == 1000 - 5
    assert info.resumed.endswith("script.py:13") and info.resumed_after
    assert (
        "the script went on after " in info.describe()
        and "(the end of its function or block)" in info.describe()
    )
    assert [where.rsplit(":", 1)[1] for where in info.left] == ["17"]  # evaluate()'s, once steady
    assert max(sink.lines) < PAD_LINE  # the pads' line events are not the script's


def test_loops_of_functions_a_forward_calls_are_never_left(tmp_path, engine):
    source = """
    def helper(log):
        for i in range(300):
            pass
        return i

    class Model:
        def forward(self, log):
            for layer in range(3):
                log.append(f"layer {layer} {helper(log)}")

    def main(log):
        Model().forward(log)
        log.append("after")
    """
    log, watch, _, ended = run_watched(tmp_path, source, engine, pad=True)
    assert log == ["layer 0 299", "layer 1 299", "layer 2 299", "after"]
    assert watch.stopped is None and not ended


def test_a_loop_last_in_its_function_ends_the_script_and_says_why(tmp_path, engine):
    source = """
    def train(log):
        for step in range(1000):
            if step < 3:
                log.append(step)

    def main(log):
        train(log)
        log.append("never")
    """
    log, watch, _, ended = run_watched(tmp_path, source, engine)
    assert ended and log == [0, 1, 2]
    info = watch.stopped
    assert info.action == "ended-script"
    assert "last statement of its function" in info.note
    assert info.describe().startswith("stopped at ")


def test_max_iterations_leaves_the_loop_too(tmp_path, engine):
    source = """
    def main(log):
        for step in range(1000):
            log.append(step)
        log.append("after")
    """
    rule = StopRule(until_steady=False, max_iterations=10)
    log, watch, _, ended = run_watched(tmp_path, source, engine, rule)
    assert not ended and log == [*range(10), "after"]
    assert watch.stopped.reason == "max-iterations" and watch.stopped.skipped == 990


def test_a_later_loop_is_left_once_steady_too(tmp_path, engine):
    source = """
    def main(log):
        for step in range(1000):
            if step < 2:
                log.append(step)
        log.append("trained")
        for batch in range(1000):
            pass
        log.append(f"evaluated {batch}")
    """
    log, watch, _, _ = run_watched(tmp_path, source, engine)
    assert log == [0, 1, "trained", "evaluated 3"]
    assert watch.stopped.loop.endswith("script.py:3")
    assert [where.rsplit(":", 1)[1] for where in watch.stopped.left] == ["7"]


def test_exits_of_loops_in_every_kind_of_block(tmp_path):
    path = tmp_path / "loops.py"
    path.write_text(
        textwrap.dedent(
            """
            for a in x:              # 2: next statement
                pass
            if c:
                while b:             # 5: last in an if: after the if
                    pass
            y = 1                    # 7
            try:
                for d in x:          # 9: last in a try body: its finally
                    pass
            finally:
                z = 2                # 12
            with m:
                for e in x:          # 14: last in a with block: no jump
                    pass
            def f():
                for g in x:          # 17: last in a function: no jump
                    for h in x:      # 18: last in its loop: where the outer one goes
                        pass
            for i in x: pass         # 20: one line: no jump
            @decorator
            def k():                 # 22
                pass
            """
        )
    )
    table = loop_table(str(path))
    exits = {header: loop.exit for header, loop in table.items()}
    # a loop that ends a block goes on at the pad after the statement that ends it
    assert exits == {2: 4, 5: 7, 9: 12, 14: PAD_LINE + 14, 17: PAD_LINE + 17, 18: PAD_LINE + 17, 20: None}
    assert table[18].through == (17,) and table[18].enclosing == (17,)
    assert table[9].kind == "for" and table[5].kind == "while"


def test_stop_info_says_what_was_left_and_round_trips():
    info = StopInfo(
        "steady",
        "t.py",
        3,
        6,
        1.5,
        "t.py:3",
        action="left-loop",
        skipped=994,
        resumed="t.py:6",
        left=("t.py:1",),
    )
    assert StopInfo.from_dict(info.to_dict()) == info
    assert info.describe() == (
        "left the loop at t.py:3 after 6 iteration(s), 1.5 s: memory steady (no new peak, allocated or "
        "reserved, and no new line for 2 iterations after 2 of warm-up); 994 iteration(s) skipped, the "
        "script went on at t.py:6; also left the loop(s) at t.py:1"
    )
    # a description written before loops were left reads as an ended script
    old = StopInfo.from_dict({"reason": "steady", "file": "t.py", "line": 3, "iterations": 4, "seconds": 1.0})
    assert old.action == "ended-script" and old.describe().startswith("stopped at t.py:3")


def test_the_python_running_the_tests_is_one_the_jump_was_checked_on():
    assert sys.version_info[:2] in ((3, 10), (3, 11), (3, 12), (3, 13), (3, 14))


DATALOADER_SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(256, 256).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(2048, 256)), batch_size=8)

def train(epoch):
    for i, (x,) in enumerate(loader):
        loss = model(x.cuda()).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

for epoch in range(3):
    train(epoch)
    print(f"epoch {epoch} ended")
print("max allocated", torch.cuda.max_memory_allocated())
"""


@pytest.mark.slow
def test_run_simulate_leaves_a_dataloader_loop_and_the_script_runs_to_its_end(tmp_path):
    from gpu_mem_track.runfolder.files import read_lines, read_meta

    (tmp_path / "train.py").write_text(DATALOADER_SCRIPT.lstrip())
    done = cli(tmp_path, "run", "--run-name", "r", "--simulate", "a100-40gb", "train.py")
    assert done.returncode == 0, done.stderr
    info = read_meta(tmp_path / "reports" / "r" / "meta.json")
    # the batch loop is nested in the epoch loop (through train()): left alone once steady
    # (4 batches in the first epoch, 2 in the others: a loop left before) in each epoch,
    # the rest of each epoch ran (its print); the epoch loop ended before its epochs were
    # steady (3 of 2 + 2), the last print ran (PyTorch's MNIST example's shape: the batch
    # loop is train()'s last statement)
    assert done.stdout.splitlines() == [*(f"epoch {e} ended" for e in range(3)), f"max allocated {info.peak}"]
    stop = info.stopped
    assert stop.action == "left-loop" and stop.loop.endswith("train.py:10") and stop.iterations == 4
    assert stop.skipped == 2048 // 8 - 4 and stop.left == ()
    assert stop.resumed.endswith("train.py:14")
    assert stop.repeats == (
        f"{tmp_path / 'train.py'}:10 3 times, {252 + 2 * 254:,} iteration(s) skipped in all",
    )
    assert "252 iteration(s) skipped, the script went on after train.py:14 (the end of its" in done.stderr
    assert "train.py:10 3 times, 760 iteration(s) skipped in all" in done.stderr
    lines = {(r.line, r.hits) for r in read_lines(tmp_path / "reports" / "r" / "lines.csv")}
    assert (11, 4 + 2 * 2) in lines and max(line for line, _ in lines) == 19  # no pad line recorded


def test_the_end_script_flag_on_the_command_line(tmp_path, capsys, monkeypatch):
    from gpu_mem_track.cli import main
    from gpu_mem_track.runfolder.files import read_meta

    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop.py").write_text("for step in range(10**6):\n    pass\nprint('after', step)\n")
    assert main(["run", "--device", "cpu", "--end-script", "loop.py"]) == 2
    assert "--end-script only applies with --simulate or --max-iterations" in capsys.readouterr().err
    base = ["run", "--device", "cpu", "--max-iterations", "5"]
    assert main([*base, "--run-name", "left", "loop.py"]) == 0
    assert capsys.readouterr().out == "after 4\n"  # 5 iterations: steps 0-4
    assert main([*base, "--run-name", "ended", "--end-script", "loop.py"]) == 0
    assert capsys.readouterr().out == ""
    ended = read_meta(tmp_path / "reports" / "ended" / "meta.json").stopped
    left = read_meta(tmp_path / "reports" / "left" / "meta.json").stopped
    assert (ended.action, ended.skipped) == ("ended-script", None)
    assert (left.action, left.skipped, left.resumed) == ("left-loop", 10**6 - 5, f"{tmp_path}/loop.py:3")
