"""``estimate(step=fn)``: the user's own training loop body, simulated as it runs.

Each loop shape is checked byte for byte against the same step run on real CPU tensors
and measured the same way (``trace_cpu_step``, as scripts/check/check_estimator.py measures).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from gpu_mem_track import estimate, find_max_batch_size
from gpu_mem_track.errors import UsageError
from gpu_mem_track.estimator.records import Estimate
from gpu_mem_track.estimator.render import render_estimate
from gpu_mem_track.estimator.simulate import trace_cpu_step
from gpu_mem_track.estimator.step import StepError


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))


def zero_grad_after_forward(model, optimizer, inputs):
    out = model(*inputs)
    optimizer.zero_grad()  # the previous step's gradients live through this forward
    out.sum().backward()
    optimizer.step()


def keep_last_output(model, optimizer, inputs):
    optimizer.zero_grad()
    out = model(*inputs)
    out.sum().backward()
    optimizer.step()
    return out  # bound until the next step's call returns, like a loop variable


LOOP_VARIABLES = {}


@pytest.fixture(autouse=True)
def _forget_loop_variables():
    """The loop variable would keep the last meta output (and its graph) alive after a test."""
    yield
    LOOP_VARIABLES.clear()


def keep_output_in_a_loop_variable(model, optimizer, inputs):
    optimizer.zero_grad()
    # As ``out = model(x)`` in a loop body: the previous output dies once this one exists.
    LOOP_VARIABLES["out"] = model(*inputs)
    LOOP_VARIABLES["out"].sum().backward()
    optimizer.step()


def accumulate_micro_batches(model, optimizer, inputs):
    optimizer.zero_grad()
    for chunk in inputs[0].chunk(4):
        (model(chunk).sum() / 4).backward()
    optimizer.step()


def skip_optimizer(model, optimizer, inputs):
    model(*inputs).sum().backward()  # gradients accumulate; no step, no zero_grad


LOOPS = [
    zero_grad_after_forward,
    keep_last_output,
    keep_output_in_a_loop_variable,
    accumulate_micro_batches,
    skip_optimizer,
]


@pytest.mark.parametrize("loop", LOOPS, ids=lambda f: f.__name__)
def test_each_loop_shape_matches_the_real_cpu_step_byte_for_byte(loop):
    est = estimate(mlp, (16, 32), device="cpu", step=loop)
    real = trace_cpu_step(mlp, (16, 32), step=loop)
    assert est == real
    assert est.step.endswith(loop.__qualname__) and est.peak > 0


def _bytes(*sizes):
    return sum(4 * n for n in sizes)


PARAMS = _bytes(32 * 64 + 64 + 64 * 16 + 16)  # 9,280 B of float32 parameters


def test_loop_shapes_differ_from_the_built_in_step_as_they_should():
    builtin = estimate(mlp, (16, 32), device="cpu")
    zero_late = estimate(mlp, (16, 32), device="cpu", step=zero_grad_after_forward)
    kept = estimate(mlp, (16, 32), device="cpu", step=keep_last_output)
    accumulated = estimate(mlp, (16, 32), device="cpu", step=accumulate_micro_batches)
    # The previous gradients are alive during the forward pass: the forward phase's
    # peak is one set of gradients higher than the built-in step's.
    forward = {p.phase: p.peak for p in builtin.phases}["forward"]
    assert {p.phase: p.peak for p in zero_late.phases}["forward"] == forward + PARAMS
    # The output (16 x 16 float32) stays alive through backward and the optimizer step,
    # and the previous call's too, until this call returns (``out = step(...)``).
    assert kept.peak == builtin.peak + 2 * _bytes(16 * 16)
    # Bound inside the step as in a loop body: the previous output dies once the new one
    # exists, so one output more at the optimizer step, and one during the forward pass.
    in_loop = estimate(mlp, (16, 32), device="cpu", step=keep_output_in_a_loop_variable)
    assert in_loop.peak == builtin.peak + _bytes(16 * 16)
    assert {p.phase: p.peak for p in in_loop.phases}["forward"] == forward + _bytes(16 * 16)
    # Micro-batches of 4 keep a quarter of the activations.
    assert accumulated.activation_bytes < builtin.activation_bytes
    assert accumulated.gradient_bytes == builtin.gradient_bytes == PARAMS


def test_skipping_the_optimizer_keeps_no_state_and_gradients_accumulate():
    est = estimate(mlp, (16, 32), device="cpu", step=skip_optimizer, optimizer="none")
    assert (est.optimizer_states, est.optimizer_state_bytes, est.gradient_bytes) == (0, 0, PARAMS)
    assert [p.phase for p in est.phases][:3] == ["step start", "forward", "loss"]
    assert "optimizer step" not in [p.phase for p in est.phases]


def test_phases_of_a_user_step_come_from_hooks_and_autograd():
    est = estimate(mlp, (16, 32), device="cpu", step=keep_last_output)
    assert [p.phase for p in est.phases] == ["step start", "forward", "loss", "backward", "optimizer step"]


def test_cuda_target_user_step_gets_the_allocator_and_workspaces():
    est = estimate(mlp, (16, 32), step=keep_last_output)
    assert est.cublas_workspace == 2 * 8_519_680 + (1 << 20)  # + cuBLASLt's (the biased addmm)
    assert est.reserved_peak >= est.peak
    assert Estimate.from_dict(json.loads(json.dumps(est.to_dict()))) == est
    text = render_estimate(est)
    assert text.startswith("Estimated step test_estimate_step:keep_last_output of ")
    assert "\nreserved peak " in text and "\ncuBLAS workspace " in text


def test_a_failing_step_is_a_step_error():
    def broken(model, optimizer, inputs):
        model(inputs[0][:, :3])

    with pytest.raises(StepError, match="^the model's step failed: RuntimeError"):
        estimate(mlp, (16, 32), device="cpu", step=broken)


STEP_FILE = """
def keep_last_output(model, optimizer, inputs):
    optimizer.zero_grad()
    out = model(*inputs)
    out.sum().backward()
    optimizer.step()
    return out
"""


def test_cli_step_option(tmp_path, in_process):
    steps = tmp_path / "steps.py"
    steps.write_text(STEP_FILE)
    args = ["estimate", "gpu_mem_track.examples:mlp", "--input", "8x784", "--device", "cpu", "--json"]
    done = in_process(*args, "--step", f"{steps}:keep_last_output")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    from gpu_mem_track.examples import mlp as example

    expected = estimate(example, (8, 784), device="cpu", step=keep_last_output).to_dict()
    assert data == json.loads(json.dumps(expected)) | {"step": data["step"]}
    assert data["step"].endswith(":keep_last_output")
    bad = in_process(*args, "--step", f"{steps}")
    assert bad.returncode == 2 and "not a step" in bad.stderr


def _loss(output):
    return output.sum()


def test_loss_and_autocast_do_not_apply_to_a_custom_step():
    with pytest.raises(UsageError, match=r"the loss test_estimate_step:_loss \(--loss, loss_fn\) does not"):
        estimate(mlp, (16, 32), device="cpu", step=keep_last_output, loss_fn=_loss)
    with pytest.raises(UsageError, match=r"^autocast \(--amp, amp\) does not apply to a custom step"):
        estimate(mlp, (16, 32), step=keep_last_output, amp="bf16")
    with pytest.raises(UsageError, match="does not apply to a custom step"):
        find_max_batch_size(mlp, [(1, 32)], budget=2**20, device="cpu", model_step=keep_last_output, amp=True)


def test_cli_step_with_loss_or_amp_exits_2(tmp_path, in_process):
    steps = tmp_path / "steps.py"
    steps.write_text(STEP_FILE + "\n\ndef loss(output):\n    return output.sum()\n")
    step = f"{steps}:keep_last_output"
    args = ["estimate", "gpu_mem_track.examples:mlp", "--input", "8x784", "--step", step]
    for extra, message in ((["--loss", f"{steps}:loss"], "--loss"), (["--amp"], "--amp")):
        done = in_process(*args, *extra)
        assert done.returncode == 2 and done.stdout == ""
        assert f"({message}," in done.stderr and len(done.stderr.strip().splitlines()) == 1


class Keyed(nn.Module):
    """Takes a keyword input and reads a value from a tensor made from known values."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x, scale=None):
        if bool((scale == 1).all()):  # the estimator's integer inputs are ones
            x = x * 2
        return self.fc(x)


def keyed_step(model, optimizer, inputs):
    x, scale = inputs  # the keyword input is in the list too, in the order given
    optimizer.zero_grad()
    model(x, scale=scale).sum().backward()
    optimizer.step()


def test_a_custom_step_gets_keyword_inputs_in_order_and_its_value_reads_recorded():
    from gpu_mem_track.estimator.records import ValueRead
    from gpu_mem_track.estimator.specs import InputSpec

    inputs = [InputSpec((16, 32)), InputSpec((16, 1), torch.int64, "scale")]
    est = estimate(Keyed, inputs, device="cpu", step=keyed_step)
    assert est.inputs == ("16x32", "scale=16x1:int64")
    # Read once in the measured step (the warmup step's read is not counted), for real.
    assert est.value_reads == (ValueRead("item", "(model)", "", 1),)
    real = trace_cpu_step(Keyed, inputs, step=keyed_step)
    assert dataclasses.replace(est, value_reads=()) == real
