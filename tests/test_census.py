from __future__ import annotations

import gc
import sys
import warnings
import weakref

import pytest
import torch
from torch import nn

from gpu_mem_track.tracker import finder as finder_module
from gpu_mem_track.tracker.census import LiveTensorFinder, full_scan, take_census
from gpu_mem_track.tracker.naming import frame_roots, merge_roots

MIB4 = 4 * 2**20


def census_of(*objects, roots=()):
    """Census of exactly ``objects`` (plus their view bases and gradients)."""
    return take_census("cpu", lambda: list(objects), list(roots))


def by_kind(census):
    return {kind: n for kind, n in census.bytes_by_kind().items() if n}


def test_views_and_slices_count_their_storage_once():
    x = torch.zeros(2**20)
    census = census_of(x, x.view(-1), x[:1], x[10:20], x.reshape(1024, 1024).t())
    assert census.nbytes == MIB4
    assert census.storages == 1
    assert census.views == 4
    assert [(g.shape, g.count) for g in census.groups] == [((2**20,), 1)]


def test_a_slice_holds_its_whole_storage_after_the_base_is_gone():
    x = torch.zeros(2**20)
    v = x[:1]
    del x
    census = take_census("cpu", lambda: [v], [("v", v)])
    assert census.nbytes == MIB4
    assert census.groups[0].names == ("v (view)",)


def test_expand_counts_the_small_storage():
    e = torch.zeros(1).expand(1000, 1000)
    assert census_of(e).nbytes == 4


def test_parameter_and_tensor_of_one_shape_are_separate_groups():
    p = nn.Parameter(torch.zeros(3, 3))
    t = torch.zeros(3, 3)
    census = census_of(p, t)
    assert [(g.kind, g.shape, g.count, g.nbytes) for g in census.groups] == [
        ("Parameter", (3, 3), 1, 36),
        ("Tensor", (3, 3), 1, 36),
    ]


def test_shared_storage_goes_to_the_parameter_not_its_data_alias():
    p = nn.Parameter(torch.zeros(8))
    alias = p.data
    census = census_of(alias, p)
    assert [(g.kind, g.nbytes) for g in census.groups] == [("Parameter", 32)]
    assert census.views == 1


def test_gradients_are_found_without_python_touching_grad():
    model = nn.Linear(10, 5)
    model(torch.randn(4, 10)).sum().backward()
    # The source sees only the parameters; the grads exist in C++ until read.
    census = take_census("cpu", lambda: list(model.parameters()), [("", model)])
    assert by_kind(census) == {"Parameter": 220, "Gradient": 220}
    names = {n for g in census.groups if g.kind == "Gradient" for n in g.names}
    assert names == {"weight.grad", "bias.grad"}


def test_buffers_optimizer_state_and_names_from_watched_roots():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    census = take_census("cpu", LiveTensorFinder(), [("", model), ("", optimizer)])
    kinds = by_kind(census)
    params = 4 * 4 * 4 + 4 * 4 + 4 * 4 + 4 * 4  # weight, bias, bn weight, bn bias (float32)
    assert kinds["Parameter"] == params
    assert kinds["Gradient"] == params
    assert kinds["Buffer"] == 4 * 4 + 4 * 4 + 8  # running mean, var, num_batches_tracked
    # Adam: exp_avg and exp_avg_sq per parameter, plus a 4-byte float32 step per parameter.
    assert kinds["Optimizer state"] == 2 * params + 4 * 4
    state_names = {n for g in census.groups if g.kind == "Optimizer state" for n in g.names}
    assert {"exp_avg of 0.weight", "exp_avg_sq of 1.bias", "step of 0.bias"} <= state_names


def test_prefixed_roots_prefix_names():
    model = nn.Linear(2, 2)
    census = take_census("cpu", lambda: [], [("teacher", model)])
    assert {n for g in census.groups for n in g.names} == {"teacher.weight", "teacher.bias"}


def test_frame_roots_name_module_level_tensors_and_find_models():
    namespace = {"weights": torch.zeros(5), "net": nn.Linear(1, 1), "other": 3}
    code = compile("import sys\nframe = sys._getframe()", "<t>", "exec")
    exec(code, namespace)
    roots = frame_roots(namespace.pop("frame"))
    assert ("weights", namespace["weights"]) in roots
    assert ("net", namespace["net"]) in roots  # a module is named by its binding: net.weight


def test_a_model_bound_at_module_level_names_its_parameters_with_the_binding(quiet_tracker):
    tracker = quiet_tracker()
    namespace = {"tracker": tracker, "nn": nn}
    code = "cnn = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))\nstamp = tracker.track()\n"
    exec(compile(code, "<module-level>", "exec"), namespace)
    names = {n for c in namespace["stamp"].changes if c.kind == "Parameter" for n in c.names}
    assert names == {"cnn.0.weight", "cnn.0.bias", "cnn.2.weight", "cnn.2.bias"}
    cnn, x = namespace.pop("cnn"), torch.zeros(1)
    # watched (without a name: the tree's names) before bound before found; tensors keep every name
    merged = merge_roots([("", cnn)], [("cnn", cnn), ("x", x)], [("", cnn), ("y", x)])
    assert [(p, o is cnn) for p, o in merged] == [("", True), ("x", False), ("y", False)]
    del namespace


def test_a_saved_slice_leaves_a_named_dataset_in_its_own_category():
    from gpu_mem_track.tracker.saved import SavedTensorRecorder

    train_data = torch.randn(1631, 20)
    weight = torch.randn(20, 4, requires_grad=True)
    recorder = SavedTensorRecorder()
    with recorder:
        out = train_data[:35] @ weight  # matmul saves the (35, 20) slice for weight's gradient
    roots = [("train_data", train_data), ("weight", weight)]
    census = take_census("cpu", lambda: [train_data, weight, out], roots, saved=recorder)
    dataset = next(g for g in census.groups if g.shape == (1631, 20))
    assert (dataset.kind, dataset.nbytes) == ("Tensor", 1631 * 20 * 4)
    assert dataset.names[0] == "train_data" and dataset.names[1].startswith("saved at test_census.py:")
    assert census.categories.activation == 0
    unnamed = take_census("cpu", lambda: [train_data, weight, out], [("weight", weight)], saved=recorder)
    assert unnamed.categories.activation == 1631 * 20 * 4  # nothing names it: what autograd saved


def test_device_filter_keeps_only_the_tracked_device():
    census = take_census("cuda:0", lambda: [torch.zeros(10)], [])
    assert census.groups == () and census.skipped == ()


class Exploding:
    """Every attribute access raises."""

    def __getattr__(self, name):
        raise RuntimeError(f"no {name} for you")


class DataWithoutSize:
    """Has a tensor .data but no .size(): crashed the classic tool."""

    def __init__(self):
        self.data = torch.zeros(2)


class Referent:
    pass


class NoStorage(torch.Tensor):
    """A wrapper subclass whose storage cannot be accessed (like DTensor)."""

    @staticmethod
    def __new__(cls):
        return torch.Tensor._make_wrapper_subclass(cls, (4,), dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(str(func))


def odd_objects():
    dead = weakref.proxy(Referent())
    with warnings.catch_warnings():  # deprecation and "beta" notices from torch
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.zeros(10), 0.1, 0, torch.quint8)
        csr = torch.eye(3).to_sparse_csr()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(100)
    return {
        "dead proxy": dead,
        "exploding": Exploding(),
        "data without size": DataWithoutSize(),
        "sparse coo": torch.eye(3).to_sparse(),
        "sparse csr": csr,
        "complex64": torch.zeros(3, dtype=torch.complex64),
        "complex128": torch.zeros(3, dtype=torch.complex128),
        "int16": torch.zeros(10, dtype=torch.int16),
        # torch.uint16/32/64 exist from torch 2.3; on older versions these entries are None.
        "uint16": torch.zeros(5, dtype=torch.uint16) if hasattr(torch, "uint16") else None,
        "uint32": torch.zeros(5, dtype=torch.uint32) if hasattr(torch, "uint32") else None,
        "uint64": torch.zeros(5, dtype=torch.uint64) if hasattr(torch, "uint64") else None,
        "float8_e4m3fn": torch.zeros(10, dtype=torch.float8_e4m3fn),
        "float8_e5m2": torch.zeros(10, dtype=torch.float8_e5m2),
        "bfloat16": torch.zeros(7, dtype=torch.bfloat16),
        "bool": torch.zeros(9, dtype=torch.bool),
        "quint8": quantized,
        "meta": torch.empty(10, device="meta"),
        "fake": fake,
        "no storage": NoStorage(),
    }


EXPECTED_BYTES = {
    "sparse coo": 2 * 3 * 8 + 3 * 4,  # int64 indices (2, nnz) + float32 values
    # crow (n+1) int64 + values; col_indices is a slice of the COO (2, nnz) int64 index
    # storage it was converted from, which it keeps alive whole (48 B).
    "sparse csr": 4 * 8 + 48 + 3 * 4,
    "complex64": 24,
    "complex128": 48,
    "int16": 20,
    "uint16": 10,
    "uint32": 20,
    "uint64": 40,
    "float8_e4m3fn": 10,
    "float8_e5m2": 10,
    "bfloat16": 14,
    "bool": 9,
    "quint8": 10,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_BYTES))
def test_every_dtype_and_layout_gets_its_true_size(name):
    objects = odd_objects()
    if objects[name] is None:
        pytest.skip(f"this torch has no {name}")
    assert census_of(objects[name]).nbytes == EXPECTED_BYTES[name]


def test_odd_objects_never_crash_the_census_and_are_reported():
    objects = odd_objects()
    census = census_of(*objects.values())
    # Only tensors count: DataWithoutSize's inner tensor is not among the objects given.
    assert census.nbytes == sum(n for name, n in EXPECTED_BYTES.items() if objects[name] is not None)
    skipped = {s.reason: (s.count, s.nominal_bytes) for s in census.skipped}
    assert skipped == {"fake": (1, 400), "meta": (1, 40), "no storage": (1, 0)}


def test_odd_objects_in_the_real_heap_never_crash_the_scan():
    keep = odd_objects()
    for source in (LiveTensorFinder(), full_scan):
        census = take_census("cpu", source, frame_roots(sys._getframe()))
        assert census.nbytes >= sum(EXPECTED_BYTES.values())
        assert {s.reason for s in census.skipped} >= {"fake", "meta", "no storage"}
    del keep


def test_fast_census_equals_full_scan_through_a_training_step():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(5, 8, requires_grad=True)
    view = x[:2]
    loss = model(x).pow(2).sum()  # graph alive: parameters and x are also held by autograd
    finder = LiveTensorFinder()
    roots = [("", model), ("", optimizer)]
    assert take_census("cpu", finder, roots) == take_census("cpu", full_scan, roots)
    loss.backward()
    optimizer.step()
    assert take_census("cpu", finder, roots) == take_census("cpu", full_scan, roots)
    del view, loss


def test_finder_sees_instances_of_a_subclass_created_after_a_census():
    finder = LiveTensorFinder()
    take_census("cpu", finder, [])
    take_census("cpu", finder, [])  # the subclass below does not exist yet

    class Late(torch.Tensor):
        pass

    late = torch.zeros(1000).as_subclass(Late)
    found = take_census("cpu", finder, [])
    assert any(g.shape == (1000,) and g.nbytes == 4000 for g in found.groups)
    del late


def test_finder_asks_again_about_a_subclass_once_it_has_instances():
    class Rare(torch.Tensor):
        pass

    finder = LiveTensorFinder()
    finder()
    finder()  # Rare now has a recorded empty reference count
    rare = torch.zeros(333).as_subclass(Rare)
    assert any(type(t) is Rare for t in finder())
    del rare


def test_the_census_keeps_no_tensor_alive():
    model = nn.Linear(100, 100)
    model(torch.randn(2, 100)).sum().backward()
    tensor = torch.zeros(1000)
    refs = [weakref.ref(tensor), weakref.ref(model.weight), weakref.ref(model.weight.grad)]
    census = take_census("cpu", LiveTensorFinder(), [("", model), ("t", tensor)])
    assert census.nbytes > 0
    del model, tensor
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


@pytest.mark.skipif(not finder_module._YOUNG_SCAN_WORKS, reason="no generational gc on this Python")
def test_young_scan_finds_tensors_born_since_the_last_walk_also_after_a_collection():
    finder = LiveTensorFinder()
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection may run between the calls below
    try:
        take_census("cpu", finder, [])
        assert finder.last_scan == "full"
        born = [torch.zeros(123) for _ in range(3)]
        young = take_census("cpu", finder, [])
        assert finder.last_scan == "young"
        assert young == take_census("cpu", full_scan, [])
        assert sum(g.count for g in young.groups if g.shape == (123,)) == 3
        born.append(torch.zeros(77))
        # survivors move to the oldest generation; the finder took the young tensors just before
        gc.collect(1)
        promoted = take_census("cpu", finder, [])
        assert finder.last_scan == "young"
        assert promoted == take_census("cpu", full_scan, [])
        assert sum(g.count for g in promoted.groups if g.shape == (77,)) == 1
        del born[0]
        assert take_census("cpu", finder, []) == take_census("cpu", full_scan, [])
        # a collection the finder did not see: the next call walks the heap
        gc.callbacks.remove(finder_module._before_promotion)
        try:
            born.append(torch.zeros(55))
            gc.collect(1)
        finally:
            gc.callbacks.append(finder_module._before_promotion)
        unseen = take_census("cpu", finder, [])
        assert finder.last_scan == "full"
        assert unseen == take_census("cpu", full_scan, [])
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.skipif(not finder_module._YOUNG_SCAN_WORKS, reason="no generational gc on this Python")
def test_the_gc_callback_leaves_with_the_last_finder_and_a_collection_mid_census_forces_a_walk(monkeypatch):
    monkeypatch.setattr(finder_module, "_WATCHING", weakref.WeakSet())  # this test's finder alone
    finder = LiveTensorFinder()
    finder()
    assert finder_module._before_promotion in gc.callbacks
    finder._busy = True  # as if another thread collected while this finder was in a census
    finder._around_collection("start")
    finder._around_collection("stop")
    finder._busy = False
    finder()
    assert finder.last_scan == "full"
    finder()
    assert finder.last_scan == "young"
    del finder
    gc.collect()  # no finder left: the callback removes itself
    assert finder_module._before_promotion not in gc.callbacks


def test_a_base_owns_its_storage_before_a_larger_expanded_view():
    b = torch.zeros(1)
    census = take_census("cpu", lambda: [b.expand(1000, 1000), b], [("b", b)])
    assert [(g.shape, g.nbytes, g.names) for g in census.groups] == [((1,), 4, ("b",))]
    assert census.views == 1


def test_owners_give_top_level_models_and_optimizers_held_weakly():
    from gpu_mem_track.tracker.finder import FullScan, Owners

    owners = Owners()
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for obj in (model[1][0], model, model[0], optimizer, model[1]):
        owners.add(obj)
    assert sorted(type(o).__name__ for _, o in owners.roots()) == ["SGD", "Sequential"]
    assert all(prefix == "" for prefix, _ in owners.roots())
    ref = weakref.ref(model)
    del model, optimizer, obj
    gc.collect()
    assert ref() is None and owners.roots() == [] and len(owners) == 0
    scan = FullScan()
    local = nn.Linear(3, 3)
    assert any(t is local.weight for t in scan()) and any(o is local for _, o in scan.roots())


def test_a_parameter_reachable_from_a_model_and_its_submodule_takes_the_model_name():
    from gpu_mem_track.tracker.naming import known_tensors

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    roots = [("head", model[1]), ("model", model), ("opt", optimizer)]
    names = [k.name for k in known_tensors(roots) if k.kind in ("Parameter", "Optimizer state")]
    assert names[:4] == ["model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias"]
    assert names[4:6] == ["head.weight", "head.bias"]  # the submodule's own root still yields them
    assert names[6:] == [f"momentum_buffer of {n}" for n in names[:4]]
    del model, optimizer


@pytest.fixture
def rank_1_of_2():
    """This process as rank 1 of 2 in torch's fake process group (collectives move
    nothing), ended after the test."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_an_fsdp2_parameter_counts_its_local_shard_on_this_rank(rank_1_of_2):
    """A DTensor has no storage of its own and the global shape; its shard (which the
    finder sees too) is what lives on the rank: counted once, under the parameter's kind
    and name, gradients and optimizer state alike. Rank 1 of 2 holds rows 512..1023 of
    the first weight, and 2 of the second's 5 rows in a chunk padded to 3."""
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 5))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 1024)).sum().backward()
    optimizer.step()
    params = list(model.parameters())
    shards = [p.to_local() for p in params]
    assert [tuple(s.shape) for s in shards] == [(512, 1024), (512,), (2, 1024), (2,)]
    local = sum(s.untyped_storage().nbytes() for s in shards)
    assert local == 4 * (512 * 1024 + 512 + 3 * 1024 + 3)  # the padded chunks' storages
    census = census_of(*params, *shards, roots=[("model", model), ("optimizer", optimizer)])
    kinds = by_kind(census)
    assert kinds["Parameter"] == kinds["Gradient"] == local
    unpadded = 4 * (512 * 1024 + 512 + 2 * 1024 + 2)  # zeros_like(shard): no padding
    assert kinds["Optimizer state"] == 2 * unpadded + 4 * 4  # exp_avg, exp_avg_sq; the steps
    assert census.skipped == ()
    named = {g.names[0]: g.shape for g in census.groups if g.kind == "Parameter"}
    assert named == {
        "model.0.weight": (512, 1024),
        "model.0.bias": (512,),
        "model.1.weight": (2, 1024),
        "model.1.bias": (2,),
    }
    assert set(kinds) == {"Parameter", "Gradient", "Optimizer state"}  # no shard counted twice
    gone = weakref.ref(model)
    del model, layer, optimizer, params, shards
    gc.collect()
    assert gone() is None


@pytest.fixture
def swap_on_conversion():
    """``nn.Module._apply`` swaps parameters with ``torch.utils.swap_tensors`` (restored after)."""
    was = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(was)


def test_the_finders_weak_references_do_not_block_a_swap_and_it_finds_the_swapped_tensors(
    swap_on_conversion,
):
    """``torch.utils.swap_tensors`` refuses a tensor with a weak reference: the finder and
    the memo drop theirs for the swap and the next call walks the heap."""
    from gpu_mem_track.tracker.bulk import CensusMemo

    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    finder, memo = LiveTensorFinder(), CensusMemo()
    roots = [("model", model)]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        take_census("cpu", finder, roots, memo=memo)
        gc.collect()  # the parameters are old: only the finder's known tensors hold them
        take_census("cpu", finder, roots, memo=memo)
        assert weakref.getweakrefs(model[0].weight)  # the census holds one
        model.to(torch.float64)
        assert model[0].weight.dtype == torch.float64
        after = take_census("cpu", finder, roots, memo=memo)
        assert finder.last_scan == "full"
        assert after == take_census("cpu", full_scan, roots)
        assert by_kind(after)["Parameter"] == 8 * (8 * 8 + 3 * 8)
        # a weak reference of the program's own still refuses the swap
        mine = weakref.ref(model[0].weight)
        with pytest.raises(RuntimeError, match="Couldn't swap"):
            model.to(torch.float32)
        del mine
        assert take_census("cpu", finder, roots, memo=memo) == take_census("cpu", full_scan, roots)
        assert finder.last_scan == "full"
        take_census("cpu", finder, roots, memo=memo)
        assert finder.last_scan == "young"  # no swap since: young scans again
    finally:
        if was_enabled:
            gc.enable()


def test_an_fsdp2_model_moves_after_a_census(rank_1_of_2):
    """FSDP2's DTensor parameters move by ``torch.utils.swap_tensors`` (``fully_shard``
    then ``model.to``), which the census's weak references blocked."""
    from torch.distributed.fsdp import fully_shard

    finder = LiveTensorFinder()
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4))
    take_census("cpu", finder, [("model", model)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    take_census("cpu", finder, [("model", model)])
    model.to(torch.float64)
    assert [p.to_local().dtype for p in model.parameters()] == [torch.float64] * 4
    census = take_census("cpu", finder, [("model", model)])
    assert census == take_census("cpu", full_scan, [("model", model)])
    assert by_kind(census)["Parameter"] == 8 * (8 * 16 + 8 + 2 * 16 + 2)
    gone = weakref.ref(model)
    del model, layer, census
    gc.collect()
    assert gone() is None
