"""The stop rule (runner/steady.py): which loop is the iteration, when memory is steady,
the budgets, and that the stop unwinds the script like an exception the script cannot
catch with ``except Exception``. The loops run for real under the settrace engine; their
"memory" is a list the traced code appends to, read as the high marks."""

from __future__ import annotations

from pathlib import Path

import pytest
from watched import Sink, run_main

from gpu_mem_track.runner.steady import LoopWatch, StopInfo, StopRule, StopRun, loop_spans


def run_watched(tmp_path: Path, source: str, rule: StopRule, clock=None) -> tuple[dict, LoopWatch, Sink]:
    """Run ``source`` (its ``main(memory)``) under a watch; ``memory`` (a list) is the high
    mark: its length. Returns the module's namespace, the watch and the sink."""
    memory: list = []
    sink = Sink()
    extra = {} if clock is None else {"clock": clock}
    watch = LoopWatch(sink, rule, lambda: len(memory), **extra)
    namespace, _ = run_main(tmp_path, source, watch, memory)
    namespace["memory"] = memory
    return namespace, watch, sink


def test_loop_spans_finds_for_and_while(tmp_path):
    path = tmp_path / "loops.py"
    path.write_text("for i in range(3):\n    x = i\n\nwhile False:\n    pass\ny = 1\n")
    assert loop_spans(str(path)) == {1: 2, 4: 5}
    assert loop_spans(str(tmp_path / "missing.py")) == {}


def test_steady_loop_stops_after_warmup_and_k_unchanged_iterations(tmp_path):
    source = """
    def main(memory):
        done = []
        for step in range(1000):
            if step < 4:
                memory.append(step)   # new highs in the first four iterations
            done.append(step)
        return done
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule())
    info = watch.stopped
    assert info is not None and info.reason == "steady"
    # highs at iterations 1-4 (steps 0-3); then 2 unchanged iterations: stopped after 6
    assert info.iterations == 6
    assert info.line == 4 and info.loop.endswith("script.py:4")
    assert namespace["memory"] == [0, 1, 2, 3]


def test_a_leak_is_never_steady_and_max_iterations_stops_it(tmp_path):
    source = """
    def main(memory):
        for step in range(1000):
            memory.append(step)   # grows every iteration
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule(max_iterations=50))
    assert watch.stopped.reason == "max-iterations"
    assert watch.stopped.iterations == 50
    assert len(namespace["memory"]) == 50


def test_without_a_budget_a_leaking_loop_runs_to_its_end(tmp_path):
    source = """
    def main(memory):
        for step in range(200):
            memory.append(step)
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule())
    assert watch.stopped is None
    assert len(namespace["memory"]) == 200


def test_max_seconds_stops_at_the_line_running_then(tmp_path):
    ticks = iter(range(10**6))
    source = """
    def main(memory):
        total = 0
        while True:
            total += 1
            memory.append(total)
    """
    rule = StopRule(until_steady=False, max_seconds=40)
    _, watch, _ = run_watched(tmp_path, source, rule, clock=lambda: next(ticks))
    info = watch.stopped
    assert info.reason == "max-seconds"
    assert info.seconds == 40
    assert info.line in (4, 5, 6)


def test_forward_loops_are_not_the_iteration(tmp_path):
    source = """
    class Model:
        def forward(self, x):
            for layer in range(100):   # a loop over layers, inside the step
                x = x + 1
            return x

    def main(memory):
        model = Model()
        out = model.forward(0)
        memory.append(out)
        return out
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule())
    assert watch.stopped is None
    assert namespace["memory"] == [100]


def test_micro_steps_are_cut_short_at_every_step_and_the_step_loop_is_left_once_steady(tmp_path):
    # nanoGPT's shape: a while loop of optimizer steps around a loop of micro-steps; the
    # optimizer's state appears only after the first micro-steps. The micro-step loop is
    # left alone (a break: the step runs) once steady, at every step; the step loop is the
    # watched loop and is left once its own iterations are steady.
    source = """
    counts = {"micro": 0, "steps": 0}
    def main(memory):
        step = 0
        while step < 100:
            for micro in range(8):
                counts["micro"] += 1
            if step == 0:
                memory.append("optimizer state")
            step += 1
            counts["steps"] = step
        counts["after"] = step
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule())
    info = watch.stopped
    assert info.reason == "steady" and info.action == "left-loop"
    assert info.loop.endswith("script.py:6") and info.iterations == 4 and info.skipped == 4
    assert info.resumed.endswith("script.py:8")  # the step after the micro-steps
    # 2 steps of warm-up, 2 unchanged; 4 micro-steps of 8 in the first, then 2 in each (a
    # loop left before: 1 of warm-up, 1 unchanged)
    assert namespace["counts"] == {"micro": 10, "steps": 4, "after": 4}
    assert namespace["memory"] == ["optimizer state"]
    assert [where.rsplit(":", 1)[1] for where in info.left] == ["5"]
    assert info.repeats == (f"{tmp_path / 'script.py'}:6 4 times, 22 iteration(s) skipped in all",)


def test_batches_inside_an_epoch_loop_are_cut_short_in_every_epoch(tmp_path):
    # PyTorch's MNIST example's shape: the epoch loop calls train(), whose loop runs the
    # batches; the batch loop is left alone once steady in each epoch, the epoch loop once
    # its epochs are steady.
    source = """
    counts = []
    def train(memory, epoch):
        for batch in range(500):
            counts.append(epoch)
            if batch < 3:
                memory.append(batch) if epoch == 1 else None
        counts.append(f"tested {epoch}")

    def main(memory):
        for epoch in range(1, 15):
            train(memory, epoch)
        counts.append("after")
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule())
    info = watch.stopped
    assert info.reason == "steady"
    assert info.loop.endswith("script.py:4") and info.iterations == 5  # the third batch's peak
    counts = namespace["counts"]
    assert [counts.count(epoch) for epoch in range(1, 6)] == [5, 2, 2, 2, 0]
    assert [c for c in counts if isinstance(c, str)] == [
        "tested 1",
        "tested 2",
        "tested 3",
        "tested 4",
        "after",
    ]
    assert [where.rsplit(":", 1)[1] for where in info.left] == ["11"]
    assert info.repeats == (
        f"{tmp_path / 'script.py'}:4 4 times, {495 + 3 * 498:,} iteration(s) skipped in all",
    )


def test_short_inner_loops_give_way_to_the_enclosing_loop(tmp_path):
    source = """
    def step(memory, i):
        for part in range(5):
            memory  # nothing new
        if i == 0:
            memory.append(i)

    def main(memory):
        for i in range(100):
            step(memory, i)
        memory.append(f"after {i}")
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule())
    info = watch.stopped
    assert info.reason == "steady"
    # the parts loop is left (a break) at its 4th pass, each time: the i loop is left once steady
    assert info.loop.endswith("script.py:3") and info.iterations == 4
    assert [where.rsplit(":", 1)[1] for where in info.left] == ["9"] and not info.ended_at
    assert namespace["memory"] == [0, "after 3"]  # i 0-3 ran, left at the 5th pass of its header


def test_the_stop_runs_finally_blocks_and_passes_except_exception(tmp_path):
    source = """
    def main(memory):
        log = memory
        try:
            for step in range(1000):
                try:
                    pass
                except Exception:
                    log.append("swallowed")
        finally:
            log.append("finally ran")
    """
    namespace, watch, _ = run_watched(tmp_path, source, StopRule())
    assert watch.stopped.reason == "steady"
    assert namespace["memory"] == ["finally ran"]


def test_a_later_loop_in_the_same_function_takes_over(tmp_path):
    # a warm-up loop, then the timed loop: the stop counts the timed loop's iterations
    source = """
    def main(memory):
        for warm in range(2):
            memory.append(warm)
        for step in range(1000):
            pass
    """
    _, watch, _ = run_watched(tmp_path, source, StopRule(max_iterations=5, until_steady=False))
    assert watch.stopped.loop.endswith("script.py:5")
    assert watch.stopped.iterations == 5


def test_stop_info_round_trips_and_describes_itself():
    info = StopInfo("steady", "train.py", 12, 7, 3.25, "train.py:12")
    assert StopInfo.from_dict(info.to_dict()) == info
    assert info.describe() == (
        "stopped at train.py:12 after 7 iteration(s) of the loop at train.py:12, 3.2 s: memory steady "
        "(no new peak, allocated or reserved, and no new line for 2 iterations after 2 of warm-up)"
    )
    budget = StopInfo("max-iterations", "t.py", 3, 10, 1.0)
    assert budget.describe().endswith("--max-iterations reached")
    assert StopRule(until_steady=False).active is False
    assert StopRule(until_steady=False, max_seconds=1).active


@pytest.mark.parametrize("reason", ["steady", "max-seconds"])
def test_stop_run_is_not_an_exception(reason):
    error = StopRun(StopInfo(reason, "t.py", 1, 0, 0.0))
    assert not isinstance(error, Exception)
    assert error.info.reason == reason
