"""The meta-op cache: a hit gives what the meta kernel gives, and the simulated GPU's
figures are the same byte for byte with and without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_mem_track.dispatch.metacache import MetaCache, _rebuilder

aten = torch.ops.aten


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def described(out):
    """Everything about the outputs a meta kernel decides, with which share a storage."""
    tensors = list(out) if isinstance(out, (list, tuple)) else [out]
    ids = [t.untyped_storage()._cdata for t in tensors]
    return [
        (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.untyped_storage().nbytes(), ids.index(i))
        for t, i in zip(tensors, ids)
    ]


@pytest.mark.parametrize(
    "func, make_args, kwargs",
    [  # the tensors are made in the test: a meta tensor a parameter list kept would outlive it
        (aten.mm.default, lambda: (meta(8, 4), meta(4, 16)), {}),
        (aten.native_layer_norm.default, lambda: (meta(2, 5, 8), [8], meta(8), meta(8), 1e-5), {}),
        (aten.add.Tensor, lambda: (meta(3, 1), meta(1, 4)), {"alpha": 2}),
        (aten.sum.dim_IntList, lambda: (meta(4, 6, dtype=torch.bfloat16), [1]), {"dtype": torch.float32}),
        (aten.native_dropout.default, lambda: (meta(7, 3), 0.1, True), {}),
        (aten.mul.Tensor, lambda: (meta(0, 3), meta(0, 3)), {}),
    ],
)
def test_a_hit_gives_what_the_meta_kernel_gives(func, make_args, kwargs):
    args = make_args()
    cache = MetaCache()
    first = cache.call(func, args, kwargs)
    again = cache.call(func, args, kwargs)
    assert (cache.misses, cache.hits) == (1, 1)
    assert described(again) == described(func(*args, **kwargs)) == described(first)

    def storages(out):
        return {t.untyped_storage()._cdata for t in (out if isinstance(out, tuple) else [out])}

    assert not storages(again) & storages(first)  # new tensors, as the kernel makes


def test_outputs_sharing_a_storage_or_past_its_start_are_rebuilt_so():
    base = meta(10, 4)
    out = (base[2:5], base[6:], meta(3).expand(3, 3))
    again = _rebuilder(out, (), {})([])
    assert described(again) == described(out)
    assert again[0].untyped_storage()._cdata == again[1].untyped_storage()._cdata
    assert again[0].untyped_storage().nbytes() == 160 and again[0].storage_offset() == 8


def test_another_shape_stride_dtype_scalar_type_or_default_dtype_is_another_entry():
    cache = MetaCache()
    x = meta(4, 4)
    calls = [
        (aten.mul.Tensor, (x, x)),
        (aten.mul.Tensor, (x, meta(4, 1))),
        (aten.mul.Tensor, (x.t(), x)),
        (aten.mul.Tensor, (x.half(), x.half())),
        (aten.add.Tensor, (meta(3, dtype=torch.int64), 1)),
        (aten.add.Tensor, (meta(3, dtype=torch.int64), 1.0)),
    ]
    for func, args in calls:
        assert described(cache.call(func, args, {})) == described(func(*args))
    assert cache.misses == len(calls) and cache.hits == 0
    assert cache.call(aten.add.Tensor, (meta(3, dtype=torch.int64), 1.0), {}).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert cache.call(aten.add.Tensor, (meta(3, dtype=torch.int64), 1.0), {}).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert cache.hits == 1 and cache.misses == len(calls) + 1


def test_writes_views_cpu_tensors_and_unknown_values_are_always_run():
    cache = MetaCache()
    x = meta(4, 4)
    for _ in range(2):
        assert cache.call(aten.add_.Tensor, (x, x), {}) is x  # writes its argument
        assert cache.call(aten.t.default, (x,), {}).untyped_storage()._cdata == x.untyped_storage()._cdata
        assert cache.call(aten.mul.Tensor, (x, torch.ones(())), {}).shape == (4, 4)  # a CPU tensor
        generator = torch.Generator()  # a value the key cannot describe
        assert cache.call(aten.bernoulli.default, (x,), {"generator": generator}).shape == (4, 4)
    assert cache.hits == 0


def test_a_call_that_raises_is_not_kept():
    cache = MetaCache()
    for _ in range(2):
        with pytest.raises(RuntimeError):
            cache.call(aten.mm.default, (meta(2, 3), meta(4, 5)), {})
    assert cache.hits == 0 and not cache._entries


def test_it_starts_again_past_its_limit():
    cache = MetaCache(limit=2)
    for n in (1, 2, 3, 1):
        cache.call(aten.neg.default, (meta(n),), {})
    assert cache.hits == 0 and cache.misses == 4  # the entry for (1,) went with the clearing


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.drop(self.mlp(self.norm(x)))


def train_on_simulated_gpu(cache: str, monkeypatch):
    """The allocator's statistics and segments after each of three steps of a small
    transformer (autocast, fused AdamW), with the cache on or off."""
    from gpu_mem_track.simgpu import simulated_gpu

    monkeypatch.setenv("GPU_MEM_TRACK_META_CACHE", cache)
    seen = []
    with simulated_gpu("a100-40gb") as gpu:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(100, 64), Block(64), Block(64), nn.Linear(64, 100)).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        for _ in range(3):
            tokens = torch.randint(0, 100, (4, 32), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(tokens)
            loss = F.cross_entropy(logits.float().view(-1, 100), tokens.view(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seen.append((torch.cuda.memory_stats(), torch.cuda.memory_snapshot()))
        hits = gpu.values.cache.hits if gpu.values.cache is not None else None
    return seen, hits


def test_the_simulated_gpu_gives_the_same_bytes_with_and_without_it(monkeypatch):
    with_cache, hits = train_on_simulated_gpu("on", monkeypatch)
    without, none = train_on_simulated_gpu("off", monkeypatch)
    assert none is None and hits > 100  # most of the steps' ops came from it
    assert with_cache == without
