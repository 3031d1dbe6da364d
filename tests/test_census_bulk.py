"""The census's fast path (``tracker.bulk``): what it remembers between censuses is never
stale where the version counter or the data pointer says so, and it counts what the
general path counts."""

from __future__ import annotations

import gc

import torch

from gpu_mem_track.tracker.bulk import CensusMemo
from gpu_mem_track.tracker.census import take_census


def census(objects, memo=None):
    return take_census("cpu", lambda: list(objects), [], memo=memo)


def groups(result):
    return sorted((g.kind, g.shape, g.dtype, g.count, g.nbytes) for g in result.groups)


def test_a_remembered_tensor_changed_in_place_is_read_again():
    memo = CensusMemo()
    a, b, c = torch.zeros(4, 4), torch.zeros(8), torch.zeros(2)
    assert groups(census([a, b, c], memo)) == [
        ("Tensor", (2,), "float32", 1, 8),
        ("Tensor", (4, 4), "float32", 1, 64),
        ("Tensor", (8,), "float32", 1, 32),
    ]
    a.unsqueeze_(0)  # version bump, same storage
    b.data = torch.zeros(3, dtype=torch.float64)  # no version bump: another storage
    c.untyped_storage().resize_(0)  # FSDP2's reshard: no version bump, no bytes left
    after = groups(census([a, b, c], memo))  # (a tensor without its bytes must not be repr'd)
    assert after == [
        ("Tensor", (1, 4, 4), "float32", 1, 64),
        ("Tensor", (2,), "float32", 1, 0),
        ("Tensor", (3,), "float64", 1, 24),
    ]
    c.untyped_storage().resize_(8)  # gathered again
    remembered, fresh = groups(census([a, b, c], memo)), groups(census([a, b, c]))
    assert remembered == fresh and ("Tensor", (2,), "float32", 1, 8) in fresh


def test_a_new_tensor_at_a_dead_tensors_id_is_not_taken_for_it():
    memo = CensusMemo()
    for size in range(1, 40):  # ids are reused as tensors die
        t = torch.zeros(size)
        assert groups(census([t], memo)) == [("Tensor", (size,), "float32", 1, 4 * size)]
        del t
        gc.collect()


def test_shared_and_special_tensors_take_the_general_path_with_the_same_result():
    memo = CensusMemo()
    base = torch.zeros(100)
    objects = [
        base,
        base[10:],  # a view: its base owns the storage
        base.view(10, 10),
        torch.zeros(3).to_sparse(),  # no data pointer: read one by one
        torch.empty(5, device="meta"),  # skipped, with its nominal bytes
        torch.zeros(7).requires_grad_(),  # may hold a .grad only C++ knows
        torch.zeros(0),  # an empty storage
    ]
    with torch.inference_mode():
        objects.append(torch.ones(6))  # no version counter
    leaf = objects[5]
    leaf.grad = torch.ones(7)
    fresh = census(objects)
    for _ in range(3):
        remembered = census(objects, memo)
        assert groups(remembered) == groups(fresh)
        assert remembered.views == fresh.views == 2
        assert remembered.skipped == fresh.skipped
    assert ("Gradient", (7,), "float32", 1, 28) in groups(fresh)
    assert ("Tensor", (100,), "float32", 1, 400) in groups(fresh)


def test_the_memo_forgets_dead_tensors():
    memo = CensusMemo()
    keep = [torch.zeros(1) for _ in range(10)]
    for _ in range(5):
        census([torch.zeros(1) for _ in range(1000)] + keep, memo)
    census(keep, memo)
    assert len(memo.facts) <= 2 * len(keep) + 1024


def test_an_unchanged_heap_reuses_the_last_split_until_anything_changes():
    memo = CensusMemo()
    tensors = [torch.zeros(3) for _ in range(50)]
    first = groups(census(tensors, memo))
    assert groups(census(tensors, memo)) == first == [("Tensor", (3,), "float32", 50, 600)]
    tensors[7].requires_grad_()  # no version change: it may now have a .grad
    tensors[7].grad = torch.ones(3)
    after = groups(census(tensors, memo))
    assert ("Gradient", (3,), "float32", 1, 12) in after and after == groups(census(tensors))
    tensors[9] = torch.zeros(2)  # another tensor in that place
    assert groups(census(tensors, memo)) == groups(census(tensors))


def named_groups(result):
    return sorted((g.kind, g.shape, g.dtype, g.count, g.nbytes, g.names) for g in result.groups)


def test_named_tensors_counted_in_bulk_keep_their_kinds_and_names():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    kept = torch.zeros(5)  # a plain tensor with a program name
    state = optimizer.state[model[0].weight]
    head = state["exp_avg"][0]  # a named view of optimizer state: its storage is shared
    roots = [("", model), ("", optimizer), ("kept", kept), ("head", head)]
    tensors = [kept, head, *model.parameters(), *(p.grad for p in model.parameters())]
    tensors += [v for s in optimizer.state.values() for v in s.values()]
    by_roots = named_groups(take_census("cpu", list, roots))  # the general path alone
    memo = CensusMemo()
    for _ in range(3):  # the bulk, then its remembered split
        in_bulk = take_census("cpu", lambda: list(tensors), roots, memo=memo)
        assert named_groups(in_bulk) == by_roots
    kinds = {(g.kind, g.names) for g in in_bulk.groups}
    assert ("Gradient", ("1.weight.grad",)) in kinds
    assert any(
        kind == "Optimizer state" and {"exp_avg of 0.weight", "head (view)"} <= set(names)
        for kind, names in kinds
    )
    assert ("Tensor", ("kept",)) in kinds
