"""Check the estimator against real steps; writes reports/estimator_check.md and .json.

For five example models, and three tiny Hugging Face models when transformers is
installed (GPT-2, Llama, BERT, trained with labels: the model's own loss), compares
the estimator's peak (CPU target: exact sizes) with the same training step run on real
CPU tensors and measured by the same storage tracking (``trace_cpu_step``): once with
the kernels the estimator simulates (math attention, PyTorch's own RNN cells: oneDNN
off) and once with the CPU's defaults. For the five examples it also checks the
estimator's parameter, gradient and optimizer-state bytes against the census
(``take_census``) of the real model after its step, and runs four training-loop shapes
as the user's own step (``estimate(step=...)``) against the same loops run for real.
The CUDA comparison (within 5% of ``max_memory_allocated``) is tests/test_estimate_cuda.py
and needs a GPU; scripts/check/check_estimator_gpu.py compares with a recorded GPU step.
"""

from __future__ import annotations

import datetime
import functools
import json
import subprocess
import sys
import warnings
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_mem_track import estimate, examples  # noqa: E402
from gpu_mem_track.estimator.simulate import trace_cpu_step  # noqa: E402
from gpu_mem_track.estimator.specs import InputSpec  # noqa: E402
from gpu_mem_track.tracker.census import take_census  # noqa: E402
from gpu_mem_track.units import format_bytes  # noqa: E402

CASES = {
    "convnet": (32, 3, 32, 32),
    "resnet": (16, 3, 32, 32),
    "transformer": (8, 64, 128),
    "mlp": (64, 784),
    "lstm": (16, 32, 64),
}

#: Token ids and labels, batch 8 of 128 tokens (gpu_mem_track.examples.hf); the last two
#: with gradient checkpointing.
HF_CASES = ("tiny_gpt2", "tiny_llama", "tiny_bert", "tiny_gpt2 checkpointing", "tiny_llama checkpointing")
HF_INPUTS = [InputSpec((8, 128), torch.int64), InputSpec((8, 128), torch.int64, "labels")]


def census_of_step(factory, shape) -> dict[str, int]:  # noqa: ANN001
    """Bytes the census finds after two real CPU steps with Adam: the parameters (with their
    gradients, which the census finds through them), the gradients alone, the Adam state."""
    model = factory()
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    x = torch.randn(shape)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        model(x).sum().backward()
        optimizer.step()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters_and_gradients": take_census("cpu", lambda: params).nbytes,
        "gradients": take_census("cpu", lambda: grads).nbytes,
        "optimizer_states": take_census("cpu", lambda: states).nbytes,
    }


def zero_grad_after_forward(model, optimizer, inputs):  # noqa: ANN001, ANN201
    out = model(*inputs)
    optimizer.zero_grad()
    out.sum().backward()
    optimizer.step()


def keep_last_output(model, optimizer, inputs):  # noqa: ANN001, ANN201
    optimizer.zero_grad()
    out = model(*inputs)
    out.sum().backward()
    optimizer.step()
    return out


def accumulate_micro_batches(model, optimizer, inputs):  # noqa: ANN001, ANN201
    optimizer.zero_grad()
    for chunk in inputs[0].chunk(4):
        (model(chunk).sum() / 4).backward()
    optimizer.step()


def skip_optimizer(model, optimizer, inputs):  # noqa: ANN001, ANN201
    model(*inputs).sum().backward()


LOOPS = (zero_grad_after_forward, keep_last_output, accumulate_micro_batches, skip_optimizer)


def check_loop(step) -> dict:  # noqa: ANN001
    """One loop shape on the convnet: the estimate (CPU target) against the real CPU loop."""
    shape = CASES["convnet"]
    est = estimate(examples.convnet, shape, device="cpu", step=step)
    real = trace_cpu_step(examples.convnet, shape, step=step)
    builtin = estimate(examples.convnet, shape, device="cpu").peak
    return {"loop": step.__name__, "estimated_peak": est.peak, "measured_peak": real.peak, "builtin": builtin}


def peaks(est, cuda, same, default) -> dict:  # noqa: ANN001
    """The figures every model's row has: the estimate on the CPU target (``est``) and on
    the CUDA target (``cuda``) against the real CPU step measured with the same kernels
    (``same``) and the default ones (``default``); errors are estimate / measured - 1."""
    return {
        "estimated_peak": est.peak,
        "estimated_peak_phase": est.peak_phase.phase,
        "cuda_target_peak": cuda.peak,
        "cuda_target_reserved": cuda.reserved_peak,
        "measured_peak_same_kernels": same.peak,
        "measured_peak_default_kernels": default.peak,
        "error_same_kernels": est.peak / same.peak - 1,
        "error_default_kernels": est.peak / default.peak - 1,
    }


def check(name: str, shape: tuple[int, ...]) -> dict:
    factory = getattr(examples, name)
    est = estimate(factory, shape, device="cpu")
    with sdpa_kernel(SDPBackend.MATH), torch.backends.mkldnn.flags(enabled=False):
        same = trace_cpu_step(factory, shape)
    default = trace_cpu_step(factory, shape)
    census = census_of_step(factory, shape)
    return {
        "model": name,
        "input": "x".join(map(str, shape)),
        **peaks(est, estimate(factory, shape, device="cuda"), same, default),
        "estimated": {k: getattr(est, k + "_bytes") for k in ("parameter", "gradient", "optimizer_state")},
        "census": census,
    }


def check_hf(name: str) -> dict:
    """The estimate of a tiny Hugging Face model against its real CPU step (no census)."""
    from gpu_mem_track.examples import hf

    function, _, option = name.partition(" ")
    factory = getattr(hf, function)
    factory = functools.partial(factory, checkpointing=True) if option else factory
    est = estimate(factory, HF_INPUTS, device="cpu")
    with sdpa_kernel(SDPBackend.MATH):
        same = trace_cpu_step(factory, HF_INPUTS)
    default = trace_cpu_step(factory, HF_INPUTS)
    return {
        "model": f"examples.hf:{name}",
        "input": ", ".join(map(str, HF_INPUTS)),
        **peaks(est, estimate(factory, HF_INPUTS, device="cuda"), same, default),
        "value_reads": [read.__dict__ for read in est.value_reads],
    }


def main() -> None:
    warnings.simplefilter("ignore")
    rows = [check(name, shape) for name, shape in CASES.items()]
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: the Hugging Face models are left out")
    else:
        rows += [check_hf(name) for name in HF_CASES]
    loops = [check_loop(step) for step in LOOPS]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    meta = {
        "commit": commit.stdout.strip() or "unknown",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "cuda_check": "recorded GPU step: reports/estimator_gpu_check.md; live GPU: make test-gpu",
    }
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    (out / "estimator_check.json").write_text(
        json.dumps({**meta, "rows": rows, "loops": loops}, indent=2) + "\n"
    )
    (out / "estimator_check.md").write_text(render(meta, rows, loops))
    print(render(meta, rows, loops))


def _placeholders(rows: list[dict]) -> str:
    used = [
        f"{r['model']}: {read['op']} in {read['module']} returned {read['placeholder']}"
        for r in rows
        for read in r.get("value_reads", [])
        if read["placeholder"]
    ]
    return "; ".join(used) or "none"


def render(meta: dict, rows: list[dict], loops: list[dict]) -> str:
    lines = [
        "# Estimator check",
        "",
        f"Commit {meta['commit']}, {meta['date']}, torch {meta['torch']}; "
        "written by `python scripts/check/check_estimator.py`.",
        "",
        "No GPU is available to this project. GPU truth comes from recorded memory snapshots:",
        "reports/estimator_gpu_check.md compares the estimator with a recorded 2.7B-parameter",
        "training step (allocated -0.25%, reserved -0.13%). On a machine with a GPU,",
        "tests/test_estimate_cuda.py (`make test-gpu`) compares with `max_memory_allocated`.",
        "What follows compares with real CPU steps.",
        "",
        "Training step with Adam, peak of the second of two steps; the estimator targets the CPU",
        "(exact sizes). *Same kernels*: the real CPU step with math attention and oneDNN off, the",
        "kernels the estimator simulates on meta tensors. *Default kernels*: the CPU's defaults",
        "(flash attention, oneDNN LSTM), which save different tensors for backward.",
        "",
        "Hugging Face models (`gpu_mem_track.examples.hf`, random init from a config, no cache) train",
        "with `labels=` given, so the loss is the model's own `.loss`; the values their code reads",
        f"(position ids, masks) are computed for real on the CPU; placeholders: {_placeholders(rows)}.",
        "",
        "| model | input | estimated peak | real, same kernels | error | real, default kernels | error |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        estimated = f"{format_bytes(r['estimated_peak'])} ({r['estimated_peak']:,} B)"
        lines.append(
            f"| {r['model']} | {r['input']} | {estimated} "
            f"| {r['measured_peak_same_kernels']:,} B | {r['error_same_kernels']:+.2%} "
            f"| {r['measured_peak_default_kernels']:,} B | {r['error_default_kernels']:+.2%} |"
        )
    lines += [
        "",
        "Parameters, gradients and Adam state after the step: the estimator's figures and what the",
        "census (`take_census`) finds on the real model after two real steps, in bytes (est / census).",
        "",
        "| model | parameters + gradients | gradients | Adam state |",
        "|---|---:|---:|---:|",
    ]
    for r in (r for r in rows if "census" in r):
        e, c = r["estimated"], r["census"]
        both = e["parameter"] + e["gradient"]
        lines.append(
            f"| {r['model']} | {both:,} / {c['parameters_and_gradients']:,} "
            f"| {e['gradient']:,} / {c['gradients']:,} "
            f"| {e['optimizer_state']:,} / {c['optimizer_states']:,} |"
        )
    lines += [
        "",
        "Your own step (`estimate(step=...)`, CPU target) against the same loop run on real CPU tensors",
        f"and measured the same way, convnet {CASES['convnet']}; the built-in step's peak for comparison:",
        "",
        "| loop | estimated peak | real peak | error | built-in step |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in loops:
        error = r["estimated_peak"] / r["measured_peak"] - 1
        lines.append(
            f"| {r['loop']} | {r['estimated_peak']:,} B | {r['measured_peak']:,} B | {error:+.2%} "
            f"| {r['builtin']:,} B |"
        )
    lines += [
        "",
        "CUDA-target estimates for the later GPU check (the simulated GPU, sm80 by default: the caching",
        "allocator model with default settings, two 8,519,680 B cuBLAS workspaces included, attention on",
        "the fused kernel the GPU picks): peak allocated / peak reserved.",
        "",
    ]
    lines += [
        f"- {r['model']} {r['input']}: {r['cuda_target_peak']:,} B / {r['cuda_target_reserved']:,} B"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
