"""The simulated GPU's catalog, its torch.cuda answers, its allocator figures against
PyTorch's own test oracles, its values and its clean exit."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

from gpu_mem_track.errors import UsageError
from gpu_mem_track.simgpu import GPUS, Bound, GpuSpec, OutOfMemory, Placeholder, parse_gpu, simulated_gpu

HERE = os.path.abspath(__file__)


def test_the_catalog_names_the_gpus_the_issue_lists_case_insensitively():
    wanted = "V100-16GB V100-32GB T4 A10G L4 L40S A100-40GB A100-80GB H100-80GB H200 RTX-3090 RTX-4090"
    for name in wanted.split():
        assert parse_gpu(name.lower()) is GPUS[name.lower()]
        assert parse_gpu(name.replace("-", "_")) is GPUS[name.lower()]
    a100 = parse_gpu("A100-40GB")
    assert a100.total_memory == 40536 * 2**20 and a100.capability == (8, 0)
    assert a100.cublas_workspace == 8_519_680 and parse_gpu("h100-80gb").cublas_workspace == 32 * 2**20
    assert all(spec.source and 0 < spec.context_bytes < spec.total_memory for spec in GPUS.values())


def test_a_custom_gpu_is_size_and_architecture_and_an_unknown_name_lists_the_names():
    spec = parse_gpu("24GiB:sm86")
    assert (spec.total_memory, spec.capability, spec.arch) == (24 * 2**30, (8, 6), "sm86")
    with pytest.raises(UsageError, match="A100-40GB.*RTX-4090"):
        parse_gpu("a100-41gb")
    with pytest.raises(UsageError):
        parse_gpu("0GiB:sm80")


def test_a_model_alone_names_the_one_gpu_of_that_model_and_refuses_an_ambiguous_one():
    for text, name in [
        ("h100", "h100-80gb"),
        ("H100", "h100-80gb"),
        ("4090", "rtx-4090"),
        ("rtx3090", "rtx-3090"),
    ]:
        assert parse_gpu(text, saved_probe=False) is GPUS[name]
    with pytest.raises(UsageError, match="'a100' could be A100-40GB or A100-80GB"):
        parse_gpu("a100")
    with pytest.raises(UsageError, match="could be V100-16GB or V100-32GB"):
        parse_gpu("V100")
    for other in ("h20", "l40", "a10", "t"):  # other GPUs (the H20, the L40) or too short: not guessed
        with pytest.raises(UsageError, match="unknown GPU"):
            parse_gpu(other)


def test_records_round_trip_through_dicts():
    spec = parse_gpu("t4")
    assert GpuSpec.from_dict(spec.to_dict()) == spec
    for record in (
        Placeholder("a.py", 3, "item", 2),
        Bound("a.py", 4, "nonzero", 100, 1),
        OutOfMemory("a.py", 5, 2 << 20, 10, 20, 30, "CUDA out of memory."),
    ):
        assert type(record).from_dict(record.to_dict()) == record


def test_torch_cuda_answers_from_the_simulation_and_nothing_is_left_after():
    before = (torch.cuda.is_available, torch.save, torch.load, torch.Tensor.pin_memory, torch.cuda.Stream)
    with simulated_gpu("A100-40GB") as gpu:
        props = torch.cuda.get_device_properties(0)
        assert (
            torch.cuda.is_available() and torch.cuda.device_count() == 1 and torch.cuda.current_device() == 0
        )
        assert props.total_memory == gpu.spec.total_memory and torch.cuda.get_device_capability() == (8, 0)
        assert torch.cuda.get_device_name(0) == "NVIDIA A100-SXM4-40GB" and torch.cuda.is_bf16_supported()
        free, total = torch.cuda.mem_get_info()
        assert total == gpu.spec.total_memory and free == gpu.spec.capacity
        with torch.cuda.device(0), torch.cuda.stream(torch.cuda.Stream()):
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            torch.cuda.synchronize()
        torch.cuda.manual_seed_all(0)
        torch.cuda.nvtx.range_push("x")
        torch.cuda.nvtx.range_pop()
    assert (
        torch.cuda.is_available,
        torch.save,
        torch.load,
        torch.Tensor.pin_memory,
        torch.cuda.Stream,
    ) == before
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0


def test_an_exception_inside_still_restores_everything():
    available = torch.cuda.is_available
    with pytest.raises(ZeroDivisionError), simulated_gpu("t4"):
        torch.set_default_device("cuda")
        assert torch.zeros(3).is_cuda
        raise ZeroDivisionError
    assert torch.cuda.is_available is available
    assert torch._C._len_torch_function_stack() == 0 and torch._C._len_torch_dispatch_stack() == 0
    assert torch.zeros(2).device.type == "cpu"


def test_pytorch_own_allocator_oracles_hold():
    """test/test_cuda.py: randn(256) raises active bytes by exactly 1024; empty(1) is a
    512 B block in a 2 MiB segment."""
    with simulated_gpu("a100-40gb"):
        before = torch.cuda.memory_stats()["active_bytes.all.current"]
        x = torch.randn(256, device="cuda")
        assert torch.cuda.memory_stats()["active_bytes.all.current"] - before == 1024
        del x
        torch.cuda.empty_cache()
        y = torch.empty(1, device="cuda")
        assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (512, 2 << 20)
        del y
        assert torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_allocated() == 1024
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == 0


def test_round_up_power2_divisions_from_alloc_conf():
    with simulated_gpu("a100-40gb", alloc_conf="roundup_power2_divisions:4"):
        x = torch.rand(21 * 2**20, device="cuda")
        assert torch.cuda.memory_allocated() == 100_663_296
        assert torch.cuda.memory_stats()["requested_bytes.all.current"] == 88_080_384
        del x


def test_simulated_tensors_say_cuda_and_cpu_tensors_stay_real():
    with simulated_gpu("t4"):
        x = torch.ones(3, device="cuda")
        cpu = torch.arange(4.0)
        y = cpu.to("cuda", non_blocking=True)
        z = cpu.cuda()
        assert x.device == torch.device("cuda", 0) and x.is_cuda and not x.is_meta and x.get_device() == 0
        assert y.is_cuda and z.is_cuda and cpu.device.type == "cpu" and cpu.sum().item() == 6.0
        assert y.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]  # small, made from known values
        assert repr(x) == "tensor([1., 1., 1.], device='cuda:0')"
        assert f"{(x * 2).sum():.1f}" == "6.0"
        assert torch.tensor([1, 2], device=0).is_cuda and cpu.pin_memory() is cpu


def test_unknown_values_get_placeholders_recorded_per_line():
    with simulated_gpu("t4") as gpu:
        w = torch.randn(2048, 2048, device="cuda")  # 16 MiB: too large for a real twin
        loss = (w @ w).sum()
        for _ in range(3):
            value = loss.item()  # the line recorded
        line = sys._getframe().f_lineno - 1
        assert value == 0.0 and not bool(loss > 0)
        assert bool(torch.isfinite(loss)) and not torch.isnan(w).any().item()  # no inf or NaN
    reads = {(p.line, p.op): p.count for p in gpu.placeholders if p.filename == HERE}
    assert reads[(line, "item")] == 3
    assert reads[(line + 2, "item")] == 1  # bool(loss > 0)


def test_data_dependent_shapes_take_their_upper_bound_recorded_per_line():
    with simulated_gpu("t4") as gpu:
        x = torch.randn(2048, 1100, device="cuda")  # over 8 MiB: no real twin
        picked = x[x > 0]
        line = sys._getframe().f_lineno - 1
        rows = torch.nonzero(x)
        small = torch.arange(6, device="cuda")
        known = small[small > 3].tolist()  # small and known: its real value
    n = 2048 * 1100
    assert picked.shape == (n,) and rows.shape == (n, 2) and known == [4, 5]
    assert {(b.line, b.bound) for b in gpu.bounds if b.filename == HERE} == {(line, n), (line + 2, n)}


def test_cublas_workspace_per_gpu_and_from_the_environment(monkeypatch):
    def first_matmul(gpu: str) -> int:
        with simulated_gpu(gpu):
            a = torch.ones(64, 64, device="cuda")
            before = torch.cuda.memory_allocated()
            b = a @ a
            return torch.cuda.memory_allocated() - before - b.untyped_storage().nbytes()

    assert first_matmul("a100-40gb") == 8_519_680
    assert first_matmul("h100-80gb") == 32 * 2**20
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert first_matmul("h100-80gb") == 131_072


def test_attention_keeps_no_sequence_square_matrix_on_ampere_unless_math_is_forced():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def peak(gpu: str, backend: SDPBackend | None) -> int:
        with simulated_gpu(gpu):
            q = torch.randn(2, 4, 1024, 64, device="cuda", dtype=torch.float16, requires_grad=True)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            if backend is None:
                out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            else:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            out.sum().backward()
            return torch.cuda.max_memory_allocated() - base

    square = 2 * 4 * 1024 * 1024 * 2  # one (B, H, T, T) float16 matrix
    flash, math = peak("a100-40gb", None), peak("a100-40gb", SDPBackend.MATH)
    assert flash < square and math > 2 * square
    assert peak("v100-16gb", None) < square  # memory-efficient attention on sm70


def test_autocast_uses_cuda_lists_inside_user_code():
    with simulated_gpu("a100-40gb"):
        x = torch.randn(4, 16, device="cuda")
        w = torch.randn(16, 16, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=torch.float16):
            y = x @ w
            n = F.layer_norm(y, (16,))
            s = torch.softmax(y, -1)
            loss = F.cross_entropy(y, torch.zeros(4, dtype=torch.long, device="cuda"))
        with (
            torch.cuda.amp.autocast(dtype=torch.bfloat16)
            if False
            else torch.amp.autocast("cuda", torch.bfloat16)
        ):
            b = F.linear(x, w)
    assert (y.dtype, n.dtype, s.dtype, loss.dtype, b.dtype) == (
        torch.float16,
        torch.float32,
        torch.float32,
        torch.float32,
        torch.bfloat16,
    )


def test_torch_load_to_cuda_simulates_and_save_of_simulated_tensors_writes_nothing(tmp_path, capsys):
    path = tmp_path / "w.pt"
    torch.save({"w": torch.arange(6.0)}, path)
    with simulated_gpu("t4") as gpu:
        loaded = torch.load(path, map_location="cuda")
        assert loaded["w"].is_cuda and loaded["w"].sum().item() == 15.0
        torch.save(loaded, tmp_path / "out.pt")
        torch.save(loaded, tmp_path / "out2.pt")
        torch.save({"plain": torch.ones(2)}, tmp_path / "cpu.pt")
    assert gpu.skipped_saves == 2 and not (tmp_path / "out.pt").exists() and (tmp_path / "cpu.pt").exists()
    assert capsys.readouterr().err.count("writes nothing") == 1


def test_a_model_built_on_the_cpu_is_virtual_until_moved_and_small_tensors_stay_real():
    with simulated_gpu("a100-40gb"):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.LayerNorm(1024))
        weight, bias = model[0].weight, model[0].bias
        mask = torch.ones(4, dtype=torch.bool)  # outside a module's construction: real
        assert weight.device.type == "cpu" and not weight.is_cuda and torch.cuda.memory_allocated() == 0
        assert (
            bias.device.type == "cpu"
            and bias.abs().device.type == "cpu"
            and repr(bias[:0]) == "tensor([], grad_fn=<SliceBackward0>)"
        )
        assert mask.device.type == "cpu" and not mask.is_meta
        opt = torch.optim.SGD(model.parameters())
        model.to("cuda")
        assert model[0].weight is weight and model[0].bias is bias and weight.is_cuda and bias.is_cuda
        assert opt.param_groups[0]["params"][0] is weight
        assert torch.cuda.memory_allocated() == (1 << 22) + 3 * 4096
        generator = torch.Generator(device="cuda")
        generator.manual_seed(0)
        assert (
            isinstance(generator, torch.Generator)
            and torch.randn(2, device="cuda", generator=generator).is_cuda
        )


def test_the_docs_table_shows_the_catalog():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "simulate.md").read_text(encoding="utf-8")
    for spec in GPUS.values():
        assert f"| {spec.name} | {spec.device_name} | {spec.total_memory:,} B " in page


def test_a_linear_shaped_einsum_leaves_no_layout_copy_in_backward():
    def backward_peak(layer) -> tuple[int, torch.dtype]:
        with simulated_gpu("h100-80gb"):
            w = torch.randn(2048, 1024, device="cuda", requires_grad=True)
            x = torch.randn(4, 32, 1024, device="cuda", requires_grad=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = layer(x, w)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            y.float().sum().backward()
            return torch.cuda.max_memory_allocated() - base, y.dtype

    linear = backward_peak(F.linear)
    assert backward_peak(lambda x, w: torch.einsum("...i,oi->...o", x, w)) == linear
    assert backward_peak(lambda x, w: torch.einsum("oi,bsi->bso", w, x)) == linear
    assert linear[1] == torch.bfloat16
