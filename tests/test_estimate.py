"""The estimator against hand arithmetic, its records and renderer, and its CLI end to end."""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import subprocess
import sys
import weakref

import pytest
import torch
from torch import nn

from gpu_mem_track import estimate
from gpu_mem_track.errors import UsageError
from gpu_mem_track.estimator.records import Breakdown, Estimate, LayerEstimate, PhasePeak
from gpu_mem_track.estimator.render import render_estimate
from gpu_mem_track.estimator.simulate import trace_cpu_step


def linear():
    return nn.Linear(10, 20)


def tiny_mlp():
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))


def test_linear_adam_on_cpu_matches_hand_arithmetic():
    est = estimate(linear, (4, 10), device="cpu")
    # weight 20x10 + bias 20 = 220 float32 elements = 880 B; gradients the same.
    assert (est.parameters, est.parameter_bytes, est.gradient_bytes) == (220, 880, 880)
    # Adam: exp_avg and exp_avg_sq per parameter (2 x 880 B) and a 4 B float32 step each.
    assert (est.optimizer_states, est.optimizer_state_bytes, est.host_bytes) == (6, 2 * 880 + 2 * 4, 0)
    # Input 4x10 float32; the only activation is the 4x20 output (addmm saves the input).
    assert (est.input_bytes, est.activation_elements, est.activation_bytes) == (160, 80, 320)


def test_linear_adam_on_cuda_rounds_every_storage_to_512_bytes():
    est = estimate(linear, (4, 10), device="cuda", cublas_workspace=0)
    assert est.parameter_bytes == 1024 + 512  # 800 B weight, 80 B bias
    assert est.gradient_bytes == 1536
    # Two states per parameter on the device; the two 4 B step counters stay on the host.
    assert (est.optimizer_states, est.optimizer_state_bytes, est.host_bytes) == (4, 3072, 8)
    assert (est.input_bytes, est.activation_bytes) == (512, 512)
    # Peak: in foreach Adam's step, parameters, gradients, states and the input are live
    # (6656 B) while _foreach_sqrt makes one temporary per exp_avg_sq (1024 + 512 B).
    assert est.peak == 8192
    assert est.peak_phase == PhasePeak("optimizer step", 8192, "_foreach_sqrt", "")
    assert est.at_peak == Breakdown(
        parameter=1536, gradient=1536, optimizer_state=3072, input=512, other=1536
    )
    assert est.at_peak.total == est.peak
    # Backward: 5120 B at the step start + loss 512 + its gradient 512 + weight grad 1024 + bias grad 512.
    assert dict((p.phase, p.peak) for p in est.phases)["backward"] == 7680
    # Every block is under 1 MiB: one 2 MiB small-pool segment holds them all.
    assert (est.reserved_peak, est.reserved_at_peak) == (2 << 20, 2 << 20)
    assert est.fragmentation == (2 << 20) - 8192
    assert est.cublas_workspace == 0 and est.allocator == ""


def test_cublas_workspaces_one_per_handle_count_in_allocated_and_share_a_segment():
    est = estimate(linear, (4, 10), device="cuda")
    # addmm in forward (the caller's handle) and mm in backward (autograd's thread's
    # handle): two 8,519,680 B workspaces, never freed, in one 20 MiB large segment; the
    # biased addmm runs cuBLASLt, whose 1 MiB workspace (gpumodel.reduce) counts with them.
    lt = 1 << 20
    assert est.cublas_workspace == 2 * 8_519_680 + lt
    assert est.peak == 8192 + 2 * 8_519_680 + lt and est.at_peak.total == 8192
    assert est.reserved_peak == (20 << 20) + (2 << 20)
    assert est.largest_free_block == (20 << 20) - 2 * 8_519_680  # cuBLASLt's 1 MiB is a small-pool block
    hopper = estimate(linear, (4, 10), device="cuda", gpu="hopper")
    assert hopper.cublas_workspace == 2 * 32 * 2**20 + lt
    assert (
        estimate(linear, (4, 10), device="cuda", cublas_workspace=":4096:8").cublas_workspace
        == 2 * 2**25 + lt
    )
    assert estimate(linear, (4, 10), device="cpu").cublas_workspace == 0


def test_inference_allocates_only_the_forward_handles_workspace():
    est = estimate(linear, (4, 10), device="cuda", training=False)
    assert est.cublas_workspace == 8_519_680 + (1 << 20)  # and cuBLASLt's (the biased addmm)


def test_a_large_block_handed_out_whole_counts_whole():
    # A 25 MiB weight (2560 x 2560 float32) gets a 26 MiB segment; the 1 MiB left is not
    # worth a split, so the block, and allocated memory, is 26 MiB.
    def wide():
        return nn.Linear(2560, 2560, bias=False)

    est = estimate(wide, (1, 2560), device="cuda", optimizer="none", training=False, cublas_workspace=0)
    assert est.parameter_bytes == 26 << 20
    cpu = estimate(wide, (1, 2560), device="cpu", optimizer="none", training=False)
    assert cpu.parameter_bytes == 25 << 20 and cpu.reserved_peak is None


def test_alloc_conf_changes_the_blocks():
    # roundup_power2_divisions:4 rounds a 25 MiB request to 28 MiB (32 MiB / 4 steps from 16).
    def wide():
        return nn.Linear(2560, 2560, bias=False)

    conf = "roundup_power2_divisions:4"
    est = estimate(wide, (1, 2560), device="cuda", optimizer="none", training=False, alloc_conf=conf)
    assert (
        est.parameter_bytes == 28 << 20
        and est.allocator == "roundup_power2_divisions:[" + ",".join(f"{1 << i}:4" for i in range(16)) + "]"
    )
    with pytest.raises(UsageError, match="unknown option 'bogus'"):
        estimate(wide, (1, 2560), alloc_conf="bogus:1")


def test_mlp_activations_per_layer_match_hand_counts():
    est = estimate(tiny_mlp, (4, 10), device="cpu")
    layers = {layer.name: layer for layer in est.layers}
    # fc1's output is freed by ReLU (which saves its own output: 4x20); fc2 keeps its
    # output 4x5 alive as the model's output. Inputs are not activations.
    assert [(n, layers[n].activation_elements) for n in ("0", "1", "2")] == [("0", 0), ("1", 80), ("2", 20)]
    assert (est.activation_elements, est.activation_bytes) == (100, 400)
    assert [(layers[n].parameters, layers[n].parameter_bytes) for n in ("0", "1", "2")] == [
        (220, 880),
        (0, 0),
        (105, 420),
    ]
    assert est.largest_activation_layer.name == "1"


def test_sgd_with_momentum_keeps_one_buffer_per_parameter():
    est = estimate(linear, (4, 10), optimizer="sgd", device="cpu")
    assert (est.optimizer_states, est.optimizer_state_bytes) == (2, 880)


def test_no_optimizer_and_inference():
    no_opt = estimate(linear, (4, 10), optimizer="none", device="cpu")
    assert (no_opt.optimizer_state_bytes, no_opt.gradient_bytes) == (0, 880)
    est = estimate(linear, (4, 10), training=False, device="cpu")
    assert (est.gradient_bytes, est.optimizer_state_bytes, est.activation_bytes) == (0, 0, 320)
    # Parameters + input + the output being made: nothing is saved under no_grad.
    assert est.peak == 880 + 160 + 320
    assert [p.phase for p in est.phases] == ["step start", "forward"]


def test_dtype_casts_parameters_and_inputs():
    est = estimate(linear, (4, 10), dtype="bf16", device="cpu", optimizer="none")
    assert (est.parameter_bytes, est.input_bytes, est.activation_bytes) == (440, 80, 160)
    assert est.dtype == "bfloat16" and est.inputs == ("4x10:bfloat16",)


def test_amp_casts_weights_and_inputs_of_linear_to_half():
    est = estimate(linear, (4, 10), amp=True, optimizer="none")
    # Alive when forward ends: the float16 copies of weight (200 elements), bias (20, held
    # by the autocast cache like autocast's own) and input (40), and the 4x20 float16
    # output; each under 512 B, so one 512 B block of the caching allocator.
    assert (est.activation_elements, est.activation_bytes) == (200 + 20 + 40 + 80, 4 * 512)
    assert (est.parameter_bytes, est.gradient_bytes) == (1024 + 512, 1024 + 512)  # float32 masters


def test_amp_needs_the_cuda_target():
    with pytest.raises(UsageError, match=r"^autocast \(--amp, amp\) is CUDA's"):
        estimate(linear, (4, 10), amp=True, device="cpu")


def test_matches_the_same_step_on_real_cpu_tensors():
    assert estimate(tiny_mlp, (8, 10), device="cpu") == trace_cpu_step(tiny_mlp, (8, 10))


def test_a_given_module_is_left_as_it_was_and_nothing_is_kept_alive():
    module = nn.Linear(10, 20).eval()
    before = module.weight.detach().clone()
    x = torch.randn(4, 10)
    est = estimate(module, x, device="cpu")
    assert est.parameters == 220 and est.inputs == ("4x10",)
    assert torch.equal(module.weight, before) and module.weight.grad is None and not module.training
    probe = weakref.ref(x)
    del x
    gc.collect()
    assert probe() is None


def test_usage_mistakes_raise_usage_errors():
    with pytest.raises(UsageError, match="unknown optimizer"):
        estimate(linear, (4, 10), optimizer="lion")
    with pytest.raises(UsageError, match="targets cuda or cpu"):
        estimate(linear, (4, 10), device="xla")
    with pytest.raises(UsageError, match="not an nn.Module"):
        estimate(lambda: 3, (4, 10))
    with pytest.raises(UsageError, match="failed with ValueError: no"):
        estimate(lambda: (_ for _ in ()).throw(ValueError("no")), (4, 10))


@pytest.mark.parametrize("dtype", ["int64", "long", "int32", "bool", torch.int64])
def test_dtype_must_be_one_a_model_trains_in(dtype):
    with pytest.raises(UsageError, match="cannot cast the model to .*: a model trains in float32, float16"):
        estimate(linear, (4, 10), dtype=dtype)


def test_integer_inputs_keep_their_dtypes_and_named_inputs_go_by_keyword():
    from gpu_mem_track.estimator.specs import InputSpec, parse_input

    assert parse_input("labels=4x32:int64") == InputSpec((4, 32), torch.int64, "labels")
    assert str(parse_input("mask=4x32:bool")) == "mask=4x32:bool"
    with pytest.raises(UsageError, match="not an input name: '1x'"):
        parse_input("1x=4x32")

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 20)

        def forward(self, x, scale=None):
            return self.fc(x) * scale

    est = estimate(Scaled, [(4, 10), InputSpec((4, 20), name="scale")], device="cpu", optimizer="none")
    assert est.inputs == ("4x10", "scale=4x20") and est.input_bytes == 160 + 320


def test_loss_defaults_to_the_outputs_own_loss_then_to_the_sum():
    from gpu_mem_track.estimator.step import default_loss

    own = torch.tensor(2.0)
    assert default_loss({"loss": own, "logits": torch.ones(3)}) is own
    assert (
        default_loss((torch.ones(2), {"x": torch.full((3,), 2.0)}, torch.ones(2, dtype=torch.int64))) == 8.0
    )

    class Output:
        loss = None
        logits = torch.ones(2)

    with pytest.raises(UsageError, match="holds no floating-point tensor"):
        default_loss(Output())  # no pytree node: neither a loss nor tensors to sum


def test_record_round_trips_through_json():
    est = estimate(tiny_mlp, (4, 10), device="cuda")
    assert Estimate.from_dict(json.loads(json.dumps(est.to_dict()))) == est
    older = {k: v for k, v in est.to_dict().items() if k not in ("loss", "value_reads")}
    assert Estimate.from_dict(older) == est  # JSON written before these fields still reads
    guarded = estimate(Guarded, (4, 10), device="cpu")
    assert Estimate.from_dict(json.loads(json.dumps(guarded.to_dict()))) == guarded


def _hand_built() -> Estimate:
    return Estimate(
        model="demo:net", device="cuda", rounding="512 B blocks", training=True, optimizer="adam",
        dtype="as built", amp=False, inputs=("4x10",), parameters=220, parameter_bytes=1536,
        buffer_bytes=0, gradient_bytes=1536, optimizer_states=4, optimizer_state_bytes=3072,
        host_bytes=8, input_bytes=512, activation_elements=80, activation_bytes=512, peak=8192,
        at_peak=Breakdown(parameter=1536, gradient=1536, optimizer_state=3072, input=512, other=1536),
        phases=(
            PhasePeak("forward", 5632, "addmm", "fc"),
            PhasePeak("optimizer step", 8192, "_foreach_sqrt", ""),
        ),
        layers=(LayerEstimate("fc", "Linear", 220, 1536, 80, 512),),
    )  # fmt: skip


def test_render_estimate_exact_text():
    assert render_estimate(_hand_built()) == (
        "Estimated training step of demo:net on cuda: inputs 4x10, dtype as built, optimizer adam; "
        "rounding: 512 B blocks\n"
        "\n"
        "layer    type      parameters    param bytes    activations    activation bytes\n"
        "-------  ------  ------------  -------------  -------------  ------------------\n"
        "fc       Linear           220       1.50 KiB             80               512 B\n"
        "total                     220       1.50 KiB             80               512 B\n"
        "\n"
        "parameters            1.50 KiB  (220 elements)\n"
        "buffers                    0 B\n"
        "gradients             1.50 KiB\n"
        "optimizer states      3.00 KiB  (4 tensors; step counters on the host: 8 B)\n"
        "inputs                   512 B\n"
        "activations              512 B  (alive when forward ends; most held by fc: 512 B)\n"
        "peak                  8.00 KiB  during optimizer step (_foreach_sqrt)\n"
        "  at the peak: parameter 1.50 KiB + optimizer state 3.00 KiB + gradient 1.50 KiB"
        " + input 512 B + other 1.50 KiB\n"
        "  phase peaks: forward 5.50 KiB, optimizer step 8.00 KiB\n"
    )


FACTORIES = """
from torch import nn

def net():
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))

def broken():
    raise ValueError("cannot build")
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("where", ["in process", pytest.param("subprocess", marks=pytest.mark.slow)])
def test_cli_estimate_prints_json(tmp_path, in_process, where):
    factories = tmp_path / "factories.py"
    factories.write_text(FACTORIES)
    args = ("estimate", f"{factories}:net", "--input", "4x10", "--device", "cpu", "--json")
    done = in_process(*args) if where == "in process" else _cli(*args)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["parameters"], data["activation_elements"], data["optimizer_states"]) == (325, 100, 12)


def test_cli_estimate_text(capsys):
    from gpu_mem_track.cli import main

    assert main(["estimate", "gpu_mem_track.examples:mlp", "--input", "2x784", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "dtype bfloat16" in out and "\ntotal " in out and "\npeak " in out


@pytest.mark.parametrize(
    ("spec", "extra", "message"),
    [
        ("{f}:net", ["--input", "64x"], "not an input shape: '64x'"),
        ("no_such_module_xyz:net", ["--input", "4x10"], "cannot import 'no_such_module_xyz'"),
        ("{f}", ["--input", "4x10"], "not a factory"),
        ("{f}:net", ["--input", "4x10", "--optimizer", "lion"], "unknown optimizer 'lion'"),
        ("{f}:net", ["--input", "4x10", "--dtype", "fp7"], "unknown dtype 'fp7'"),
        ("{f}:broken", ["--input", "4x10"], "broken failed with ValueError: cannot build"),
        ("{f}:net", ["--input", "4x10", "--dtype", "int64"], "cannot cast the model to int64"),
        ("{f}:net", ["--input", "4x10", "--dtype", "bool"], "cannot cast the model to bool"),
        ("{f}:net", ["--input", "4x10", "--loss", "{f}:nothing"], "has no callable named 'nothing'"),
        ("{f}:net", ["--input", "4x10", "--loss", "{f}:net"], "the model's step failed: TypeError"),
        ("{f}:net", ["--input", "4x11"], "the model's step failed: RuntimeError"),
        ("{f}:net", ["--input", "4x10", "--device", "tpu"], "targets cuda or cpu, not 'tpu'"),
    ],
)
def test_cli_estimate_usage_mistakes_exit_2_with_one_line(tmp_path, capsys, spec, extra, message):
    from gpu_mem_track.cli import main

    factories = tmp_path / "factories.py"
    factories.write_text(FACTORIES)
    extra = [arg.format(f=factories) for arg in extra]
    assert main(["estimate", spec.format(f=factories), *extra]) == 2
    out, err = capsys.readouterr()
    assert message in err and err.startswith("gpu_mem_track: ")
    assert len(err.strip().splitlines()) == 1 and out == ""


def test_the_models_own_error_is_a_step_error_caused_by_it():
    from gpu_mem_track.estimator.step import StepError

    with pytest.raises(StepError, match="^the model's step failed: RuntimeError: ") as caught:
        estimate(linear, (4, 11), device="cpu")
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_cli_does_not_blame_the_model_for_our_bug(tmp_path, monkeypatch, in_process):
    from gpu_mem_track.cli import BUG_REPORT
    from gpu_mem_track.estimator import simulate

    def buggy(*args, **kwargs):
        raise TypeError("a bug of ours")

    monkeypatch.setattr(simulate, "estimate", buggy)
    done = in_process("estimate", "gpu_mem_track.examples:mlp", "--input", "2x784")
    assert done.returncode == 1 and "step failed" not in done.stderr
    assert "TypeError: a bug of ours" in done.stderr and done.stderr.endswith(f"{BUG_REPORT}\n")


@pytest.mark.slow
def test_cli_estimate_failure_end_to_end(tmp_path):
    factories = tmp_path / "factories.py"
    factories.write_text(FACTORIES)
    done = _cli("estimate", f"{factories}:broken", "--input", "4x10")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"gpu_mem_track: calling the factory {factories}:broken failed with ValueError: cannot build\n"
    )


def test_cli_amp_may_come_before_the_factory_and_the_factory_prints_as_written(tmp_path, capsys):
    from gpu_mem_track.cli import main

    (tmp_path / "factories.py").write_text(FACTORIES)
    spec = str(tmp_path / "factories.py") + ":net"
    outputs = []
    for args in (["--amp", spec], [spec, "--amp", "fp16"], [spec, "--amp"], ["--amp=bf16", spec]):
        assert main(["estimate", *args, "--input", "4x10", "--json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert all(out["amp"] for out in outputs) and outputs[0] == outputs[1] == outputs[2]
    assert outputs[0]["model"] == spec  # not _gpu_mem_track_factory_<hash>:net
    assert outputs[3]["activation_bytes"] == outputs[0]["activation_bytes"]  # bf16: same sizes
    assert main(["estimate", "--amp", "--input", "4x10"]) == 2
    assert "estimate needs a model factory" in capsys.readouterr().err
    assert main(["estimate", "--amp", spec, spec, "--input", "4x10"]) == 2
    assert "two factories given" in capsys.readouterr().err
    for amp in (["--amp", "fp8"], ["--amp=fp8"]):  # a dtype autocast does not take: said as such
        assert main(["estimate", spec, *amp, "--input", "4x10"]) == 2
        assert capsys.readouterr().err == (
            "gpu_mem_track: --amp takes autocast's dtype: fp16, float16, half, bf16 or bfloat16 "
            "(default fp16), not 'fp8'\n"
        )


def test_cli_loss_function_from_a_file(tmp_path, capsys):
    from gpu_mem_track.cli import main

    loss = "\n\ndef big(output):\n    return (output.repeat(1000, 1) ** 2).sum()\n"
    (tmp_path / "factories.py").write_text(FACTORIES + loss)
    spec = str(tmp_path / "factories.py")
    common = ["estimate", f"{spec}:net", "--input", "4x10", "--device", "cpu", "--json"]
    assert main(common) == 0
    summed = {p["phase"]: p["peak"] for p in json.loads(capsys.readouterr().out)["phases"]}
    assert main([*common, "--loss", f"{spec}:big"]) == 0
    big = {p["phase"]: p["peak"] for p in json.loads(capsys.readouterr().out)["phases"]}
    # The 4x5 output repeated to 4000x5 float32 (80,000 B), then squared (80,000 B more).
    assert big["loss"] == summed["loss"] + 2 * 80_000


class Guarded(nn.Module):
    """Reads values in Python as library code does: a check on an activation (no value on
    meta: a placeholder), a data-dependent op and a copy to the CPU on a tensor it made."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 20)

    def forward(self, x):
        h = self.fc(x)
        if torch.isinf(h).any():
            h = h.clamp(-1e4, 1e4)
        keep = (torch.arange(x.shape[0], device=x.device) % 2 == 0).nonzero().squeeze(1)
        return h[keep] * len(keep.tolist())


def test_values_read_by_the_model_are_computed_or_replaced_by_a_noted_placeholder():
    from gpu_mem_track.estimator.records import ValueRead

    est = estimate(Guarded, (4, 10), device="cpu")
    real = trace_cpu_step(Guarded, (4, 10))  # real values: no reads to record
    assert real.value_reads == () and dataclasses.replace(est, value_reads=()) == real
    # Rows 0 and 2 kept: the output is 2x20 (160 B) plus the 2 int64 indices (16 B).
    assert est.activation_bytes == 176
    assert set(est.value_reads) == {
        ValueRead("item", "(model)", "False", 1),  # isinf(h).any() on an activation
        ValueRead("nonzero", "(model)", "", 1),
        ValueRead("copy to cpu", "(model)", "", 1),  # tolist()
    }
    text = render_estimate(est)
    assert "\nvalues read by the model: " in text and "(computed for real on the CPU)\n" in text
    assert text.endswith(
        "placeholders (values unknown without data; the model ran on these instead): "
        "item in (model) returned False\n"
    )


def test_a_tensor_given_with_values_keeps_them_on_meta():
    class Select(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 20)

        def forward(self, x, mask):
            return self.fc(x[mask.nonzero().squeeze(1)])

    mask = torch.tensor([True, False, False, True, True])
    est = estimate(Select, [(5, 10), mask], device="cpu", optimizer="none")
    # Three rows selected (not five, nor a placeholder's none): their 3x10 copy, saved for
    # backward, and the 3x20 output.
    assert est.activation_bytes == 3 * 10 * 4 + 3 * 20 * 4
    assert est.peak == trace_cpu_step(Select, [(5, 10), mask], optimizer="none").peak


HF_MODELS = [("tiny_gpt2", {}), ("tiny_llama", {}), ("tiny_bert", {}), ("tiny_gpt2", {"checkpointing": True})]


def _token_inputs():
    from gpu_mem_track.estimator.specs import InputSpec

    return [InputSpec((4, 32), torch.int64), InputSpec((4, 32), torch.int64, "labels")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), HF_MODELS)
def test_hugging_face_training_step_equals_the_real_cpu_step(name, options):
    pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpu_mem_track.examples import hf

    factory = functools.partial(getattr(hf, name), **options)
    est = estimate(factory, _token_inputs(), device="cpu")
    assert est.model == f"gpu_mem_track.examples.hf:{name}"
    with sdpa_kernel(SDPBackend.MATH):  # the attention meta tensors run
        real = trace_cpu_step(factory, _token_inputs())
    # Every figure equal (tolerance 0): peak, phases, parts at the peak, per-layer rows.
    assert dataclasses.replace(est, value_reads=()) == real
    if not options:  # the model's own loss (labels): cross-entropy's backward holds the peak
        assert est.peak_phase.op == "_log_softmax_backward_data"
    assert all(read.placeholder == "" for read in est.value_reads)
    cuda = estimate(factory, _token_inputs(), device="cuda")
    assert cuda.parameters == est.parameters and cuda.peak >= est.peak  # 512 B blocks


@pytest.mark.slow
def test_cli_estimates_a_tiny_gpt2_without_cache(tmp_path, capsys):
    pytest.importorskip("transformers")
    from gpu_mem_track.cli import main

    models = tmp_path / "models.py"
    models.write_text(
        "from transformers import GPT2Config, GPT2LMHeadModel\n\n"
        "def tiny_gpt2():\n"
        "    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, bos_token_id=0,\n"
        "                        eos_token_id=0, use_cache=False)\n"
        "    return GPT2LMHeadModel(config)\n"
    )
    args = ["estimate", f"{models}:tiny_gpt2", "--input", "4x32:int64", "--input", "labels=4x32:int64"]
    assert main(args) == 0  # was: the model's step failed: ... Tensor.item() ... on meta tensors
    out = capsys.readouterr().out
    assert out.startswith(f"Estimated training step of {models}:tiny_gpt2 on cuda: inputs ")
    assert "\nvalues read by the model: item in transformer (computed for real on the CPU)\n" in out
    assert "placeholders" not in out


def test_a_copy_of_an_activation_to_the_cpu_is_a_noted_placeholder_of_zeros():
    from gpu_mem_track.estimator.records import ValueRead

    class Logs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 20)

        def forward(self, x):
            h = self.fc(x)
            self.seen = h.detach().cpu()
            return h

    est = estimate(Logs, (4, 10), device="cpu", training=False)
    assert est.value_reads == (ValueRead("copy to cpu", "(model)", "zeros", 1),)


def test_warmup_zero_measures_the_first_step_with_a_fresh_optimizer():
    first = estimate(linear, (4, 10), device="cpu", warmup=0)
    steady = estimate(linear, (4, 10), device="cpu")
    forward = {p.phase: p.peak for p in first.phases}["forward"]
    # In the steady step Adam's states (exp_avg, exp_avg_sq and the step counters) are
    # alive during the forward pass; in the first step they do not exist yet.
    assert {p.phase: p.peak for p in steady.phases}["forward"] == forward + steady.optimizer_state_bytes
    assert first.optimizer_state_bytes == steady.optimizer_state_bytes == 2 * 880 + 8
    with pytest.raises(UsageError, match="warmup must be a count of steps >= 0, not -1"):
        estimate(linear, (4, 10), warmup=-1)


def test_cublas_workspace_sizes_follow_pytorchs_rules():
    from gpu_mem_track.commands.model_args import GPU_ARCHITECTURES
    from gpu_mem_track.gpumodel import workspace as memory

    assert tuple(memory.GPU_ARCHITECTURES) == GPU_ARCHITECTURES
    assert memory.workspace_bytes(None, ":4096:2:16:8") == memory.DEFAULT_WORKSPACE == 8_519_680
    assert memory.workspace_bytes("hopper", "") == memory.HOPPER_WORKSPACE == 32 * 2**20
    assert memory.workspace_bytes("ampere", "") == 8_519_680
    assert memory.workspace_bytes("ampere", ":16:8") == 131_072  # the config wins over the GPU
    with pytest.raises(UsageError, match="expected :SIZE:COUNT pairs"):
        memory.workspace_bytes(None, "4096")
    with pytest.raises(UsageError, match="unknown GPU architecture 'tpu'"):
        memory.workspace_bytes("tpu", None)


def test_cublas_workspace_config_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert estimate(linear, (4, 10), training=False).cublas_workspace == 32 * 2**20 + (
        1 << 20
    )  # + cuBLASLt's
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert estimate(linear, (4, 10), training=False).allocator == "expandable_segments:True"


def test_render_estimate_with_the_allocator_exact_text():
    from dataclasses import replace

    est = replace(
        _hand_built(),
        rounding="CUDA caching allocator (default settings)",
        peak=8192 + 2 * 8_519_680,
        reserved_peak=23068672,
        reserved_at_peak=23068672,
        largest_free_block=3932160,
        cublas_workspace=2 * 8_519_680,
    )
    text = render_estimate(est)
    assert text.endswith(
        "  at the peak: parameter 1.50 KiB + optimizer state 3.00 KiB + gradient 1.50 KiB"
        " + input 512 B + other 1.50 KiB + cuBLAS workspace 16.25 MiB\n"
        "  phase peaks: forward 5.50 KiB, optimizer step 8.00 KiB\n"
        "reserved peak        22.00 MiB  (caching allocator segments; settings: defaults)\n"
        "  at the peak: reserved 22.00 MiB, fragmentation (reserved - allocated) 5.74 MiB,"
        " largest free block 3.75 MiB\n"
        "cuBLAS workspace     16.25 MiB  (one per handle: forward and backward; in allocated, never freed)\n"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--alloc-conf", "bogus:1"], "PYTORCH_CUDA_ALLOC_CONF 'bogus:1': unknown option 'bogus'"),
        (["--gpu", "tpu"], "unknown GPU 'tpu': choose an architecture (volta, turing"),
        (["--cublas-workspace", "lots"], "--cublas-workspace: not a byte size: 'lots'"),
        (["--step", "no_such_module_xyz:step"], "cannot import 'no_such_module_xyz'"),
    ],
)
def test_cli_memory_model_mistakes_exit_2(capsys, extra, message):
    from gpu_mem_track.cli import main

    assert main(["estimate", "gpu_mem_track.examples:mlp", "--input", "2x784", *extra]) == 2
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_cli_memory_model_options(in_process):
    args = ["estimate", "gpu_mem_track.examples:mlp", "--input", "2x784", "--json"]
    done = in_process(*args, "--gpu", "hopper", "--alloc-conf", "max_split_size_mb:64", "--warmup", "0")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    from gpu_mem_track.examples import mlp

    expected = estimate(mlp, (2, 784), gpu="hopper", alloc_conf="max_split_size_mb:64", warmup=0)
    assert data == json.loads(json.dumps(expected.to_dict()))
    assert data["cublas_workspace"] == 2 * 32 * 2**20 + (1 << 20)  # + cuBLASLt's (biased linears)
    assert data["allocator"] == "max_split_size_mb:64"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--gpu", "h100"], "the simulated GPU (--gpu, gpu)"),
        (["--alloc-conf", "expandable_segments:True"], "the allocator settings (--alloc-conf, alloc_conf)"),
        (["--cublas-workspace", "0"], "the cuBLAS workspace (--cublas-workspace, cublas_workspace)"),
    ],
)
def test_cli_a_cuda_memory_model_on_the_cpu_target_is_a_usage_mistake(tmp_path, capsys, option, message):
    """--gpu h100 --device cpu printed exact CPU sizes as if no GPU had been named."""
    from gpu_mem_track.cli import main

    (tmp_path / "factories.py").write_text(FACTORIES)
    spec = str(tmp_path / "factories.py") + ":net"
    for command in (["estimate"], ["batch-size", "--budget", "1GiB"]):
        assert main([*command, spec, "--input", "4x10", "--device", "cpu", *option]) == 2
        said = f"gpu_mem_track: {message} is the CUDA target's: it does not apply to cpu\n"
        assert capsys.readouterr() == ("", said)
