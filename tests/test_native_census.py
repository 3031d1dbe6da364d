"""The census's native reader (``gpu_mem_track.native``): built here against this torch,
it must count exactly what the Python reads count. The census and tracker tests run again
below with it in use (imported from their modules)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
import weakref

import pytest
import torch

# The census and tracker tests, collected here again: the autouse fixture below runs them
# with the native reader.
from test_census import *  # noqa: F403, E402
from test_tracker import *  # noqa: F403, E402
from torch import nn

from gpu_mem_track import MemTracker, native
from gpu_mem_track.native import build
from gpu_mem_track.tracker import nativebulk as nativebulk_module
from gpu_mem_track.tracker.census import full_scan, take_census
from gpu_mem_track.tracker.nativebulk import NativeBulk


@pytest.fixture(scope="session")
def reader(tmp_path_factory):
    root = tmp_path_factory.mktemp("native-cache")
    target = build.plan(root)
    if target.missing:
        pytest.skip(f"the native reader cannot be built here: {target.missing}")
    target = build.build(root)
    assert target.built, (target.folder / "build.log").read_text()[-3000:]
    module, note = native._load(target.module)
    assert module is not None, note
    return module


@pytest.fixture(autouse=True)
def native_reader(reader):
    with native.use(reader):
        assert native.census_scan() is reader
        yield reader


def both(objects, roots=(), device="cpu"):
    """The census of ``objects`` read natively and through Python."""
    source = lambda: list(objects)  # noqa: E731
    fast = take_census(device, source, roots)
    with native.use(None):
        slow = take_census(device, source, roots)
    return fast, slow


def zoo():
    """Tensors of every kind the bulk may meet, and what shares their storages."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.zeros(10), 0.1, 0, torch.quint8)
    base = torch.zeros(6, 4)
    offset = torch.empty(0).set_(torch.zeros(20).untyped_storage(), 8, (3,))
    resized = torch.zeros(32)
    resized.untyped_storage().resize_(0)  # FSDP2's freed parameter
    swapped = torch.zeros(5)
    swapped.data = torch.ones(7, dtype=torch.float64)
    with torch.inference_mode():
        inference = torch.ones(9)
    param = nn.Parameter(torch.zeros(3, 3))
    frozen = nn.Parameter(torch.zeros(2, 2), requires_grad=False)
    frozen_view = frozen[0]
    shared_a = torch.zeros(8)
    shared_b = torch.empty(0).set_(shared_a.untyped_storage(), 0, (2, 4))
    orphan_view = torch.arange(10.0)[2:5]  # its base has no Python object
    return {
        "plain": [torch.zeros(4), torch.zeros(4), torch.ones(2, 3, dtype=torch.float16)],
        "views": [base, base[1], base[2:4], base.t(), base.view(24), base.expand(2, 6, 4)],
        "offset": [offset],
        "resized to nothing": [resized],
        ".data swapped": [swapped],
        "inference": [inference],
        "parameters": [param, frozen, frozen_view],
        "shared without a view": [shared_a, shared_b],
        "view of an unseen base": [orphan_view],
        "requires grad": [torch.zeros(3, requires_grad=True)],
        "leaves with and without gradients, non-leaves": _autograd_tensors(),
        "objects given twice": _repeated(),
        "odd": [torch.eye(3).to_sparse(), torch.zeros(2, device="meta"), quantized, "text", 3, None],
        "empty": [torch.zeros(0), torch.zeros(0, 3)],
        "dtypes": [torch.zeros(3, dtype=dtype) for dtype in (torch.bool, torch.complex64, torch.bfloat16)],
    }


def _repeated():
    alone, based = torch.zeros(5), torch.zeros(10)
    view = based[:2]
    return [alone, alone, based, view, view, based, alone]


def _autograd_tensors():
    weight = torch.ones(3, 3, requires_grad=True)
    unused = torch.ones(5, requires_grad=True)  # a leaf without a gradient
    frozen_param = nn.Parameter(torch.ones(4))
    hidden = weight * 2  # a non-leaf requiring grad, with retained gradient
    hidden.retain_grad()
    loss = (hidden @ torch.ones(3)).sum()  # a non-leaf kept, as `losses.append(loss)` does
    loss.backward(retain_graph=True)
    # weight.grad exists only in C++ until read; hidden.grad is never read by the census
    return [weight, unused, frozen_param, hidden, loss]


@pytest.mark.parametrize("case", sorted(zoo()))
def test_the_native_reader_counts_what_python_counts(case):
    fast, slow = both(zoo()[case])
    assert fast == slow


def test_every_case_at_once_and_named_by_roots():
    cases = zoo()
    objects = [obj for group in cases.values() for obj in group]
    roots = [
        ("kept", cases["plain"][0]),
        ("frozen", cases["parameters"][1]),
        ("b", cases["shared without a view"][1]),
    ]
    fast, slow = both(objects, roots)
    assert fast == slow
    assert fast.views == slow.views > 0


def test_a_named_base_and_its_unnamed_views_are_settled_natively(native_reader, monkeypatch):
    data = torch.zeros(300, 4)
    rows = list(data.unbind(0))
    moved = []
    settle = nativebulk_module.NativeBulk.settle

    def spy(self, seen, owners):
        given = settle(self, seen, owners)
        moved.extend(given)
        return given

    monkeypatch.setattr(nativebulk_module.NativeBulk, "settle", spy)
    fast, slow = both([data, *rows], [("data", data)])
    assert fast == slow
    assert fast.views == 300 and fast.storages == 1
    assert moved == []  # the base owns, named; its views stay in the bulk
    fast, slow = both([data, *rows], [("data", data), ("first", rows[0])])
    assert fast == slow  # a named view: the general path ranks and names
    assert len(moved) == 301


def test_gradients_that_exist_only_in_cpp_are_counted_and_named_after_their_leaves():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    model(torch.randn(4, 8)).sum().backward()  # no optimizer: .grad never read in Python
    fast, slow = both(list(model.parameters()), [("model", model)])
    assert fast == slow
    gradients = {name for g in fast.groups if g.kind == "Gradient" for name in g.names}
    assert gradients == {
        "model.0.weight.grad",
        "model.0.bias.grad",
        "model.2.weight.grad",
        "model.2.bias.grad",
    }


class _Marked(torch.Tensor):
    """A tensor subclass: the general path's, whatever it is a view of."""


@pytest.mark.parametrize("grad_object_given", [False, True])
def test_a_gradient_is_counted_once_when_the_general_path_reaches_its_leaf(grad_object_given):
    weight = torch.randn(4, 4, requires_grad=True)
    (weight * 2).sum().backward()
    marked = weight[0:2].as_subclass(_Marked)  # its base, weight, is reached as a relative
    objects = [weight, marked, weight.grad] if grad_object_given else [weight, marked]
    fast, slow = both(objects, [("w", weight)])
    assert fast == slow
    assert [(g.kind, g.nbytes, g.names) for g in fast.groups if g.kind == "Gradient"] == [
        ("Gradient", 64, ("w.grad",))
    ]


def test_a_gradient_is_counted_once_when_autograd_saves_a_view_of_its_leaf():
    weight = torch.randn(4, 4, requires_grad=True)
    (weight * 2).sum().backward()
    x = torch.randn(3, 4, requires_grad=True)
    stamps = []
    for reader_in_use in (True, False):
        with MemTracker(out_dir=None, verbosity=0, probe=False, device="cpu", activations=True) as tracker:
            y = x @ weight.t()  # autograd saves weight.t(), a view: the general path reaches weight
            if reader_in_use:
                stamps.append(tracker.track())
            else:
                with native.use(None):
                    stamps.append(tracker.track())
            del y
    assert stamps[0].ledger.tensors == stamps[1].ledger.tensors
    assert stamps[0].changes == stamps[1].changes
    for stamp in stamps:  # weight's gradient, 16 float32, once
        assert sum(c.bytes_delta for c in stamp.changes if c.kind == "Gradient") == 64


def test_a_training_step_with_optimizer_state_and_names():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    kept = [torch.randn(16) for _ in range(50)]
    slices = [tensor[:4] for tensor in kept[:10]]
    roots = [("model", model), ("optimizer", optimizer), ("kept", kept)]
    fast, slow = both(full_scan(), roots)
    assert fast == slow
    assert {g.kind for g in fast.groups} >= {"Parameter", "Gradient", "Optimizer state", "Tensor"}
    del slices


def test_a_tracker_stamps_the_same_with_and_without_it():
    model = nn.Linear(16, 16)
    batch = [torch.randn(8, 16) for _ in range(20)]  # noqa: F841 - named by the frame
    stamps = []
    for reader_in_use in (True, False):
        tracker = MemTracker(out_dir=None, verbosity=0, probe=False, device="cpu")
        tracker.watch(model)
        if reader_in_use:
            stamps.append(tracker.track())
        else:
            with native.use(None):
                stamps.append(tracker.track())
    assert stamps[0].ledger.tensors == stamps[1].ledger.tensors
    assert stamps[0].changes == stamps[1].changes


def test_a_census_under_a_torch_function_mode_reads_through_python(monkeypatch):
    made = []
    monkeypatch.setattr(nativebulk_module, "NativeBulk", lambda *a: made.append(a) or NativeBulk(*a))
    tensors = [torch.zeros(3), torch.zeros(5)]
    take_census("cpu", lambda: tensors)
    assert len(made) == 1

    class Passing(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        under_mode = take_census("cpu", lambda: tensors)
    assert len(made) == 1  # not used under the mode
    assert under_mode.nbytes == 32


def test_the_census_holds_no_tensor_after_a_native_read():
    import weakref

    tensor = torch.zeros(100)
    ref = weakref.ref(tensor)
    objects = [tensor, tensor[:3]]
    take_census("cpu", objects.copy)
    objects.clear()
    del tensor
    gc.collect()
    assert ref() is None


def test_pick_keeps_the_objects_of_exactly_the_asked_types_in_order(reader):
    class Sub(torch.Tensor):
        pass

    model, first, second = nn.Linear(2, 2), torch.zeros(1), torch.ones(2)
    sub = torch.zeros(1).as_subclass(Sub)
    objects = [first, "text", model, sub, 3, second, model.weight]
    tensors, owners = reader.pick(objects, frozenset({torch.Tensor, nn.Parameter}), frozenset({nn.Linear}))
    assert tensors == [first, second, model.weight] and tensors[0] is first  # not the subclass
    assert owners == [model]
    with pytest.raises(TypeError):
        reader.pick(objects, [torch.Tensor], frozenset())


def test_refs_are_weak_references_out_of_the_collectors_lists(reader):
    tensors = [torch.zeros(1), torch.ones(1)]
    refs = reader.refs(tensors)
    assert [ref() for ref in refs] == tensors and not any(map(gc.is_tracked, refs))
    del tensors[0]
    gc.collect()
    assert refs[0]() is None and refs[1]() is not None
    kept = torch.zeros(1)
    before = sys.getrefcount(kept)
    with pytest.raises(TypeError):  # an int takes no weak reference: the ones made are let go
        reader.refs([kept, 3])
    assert sys.getrefcount(kept) == before and weakref.getweakrefcount(kept) == 0


def test_a_first_heap_walk_finds_what_the_python_walk_finds():
    from gpu_mem_track.tracker.finder import LiveTensorFinder

    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    held = [torch.zeros(2), torch.ones(3, dtype=torch.float16)]
    fast_finder = LiveTensorFinder()
    fast = fast_finder()
    with native.use(None):
        slow_finder = LiveTensorFinder()
        slow = slow_finder()
    assert fast_finder.last_scan == slow_finder.last_scan == "full"
    # the same tensors (the heap's order may change between the walks: a collection moves objects)
    assert sorted(map(id, fast)) == sorted(map(id, slow)) and all(any(t is h for t in fast) for h in held)
    assert {id(o) for _, o in fast_finder.roots()} == {id(o) for _, o in slow_finder.roots()}
    assert any(o is optimizer for _, o in fast_finder.roots())
    fast = slow = None
    born = torch.zeros(4)  # the next call's young scan meets it once
    again = fast_finder()
    assert fast_finder.last_scan in ("young", "full") and sum(t is born for t in again) == 1


def test_a_module_that_reads_differently_is_refused():
    class Wrong:
        ABI = native.ABI

        class Scan:
            def __init__(self, objects, *args):
                self.views = 0

            def codes(self):
                return bytes(5)

            def settle(self, *args):
                return []

            def groups(self, *args):
                return [], {}, {}

    assert native._self_check(Wrong) != ""


def test_a_failed_build_is_recorded_and_not_retried_automatically(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/bin/false")
    target = build.build(tmp_path)
    assert not target.built and target.failed
    assert "/bin/false" in (target.folder / "build.log").read_text()
    assert build.plan(tmp_path).failed


def test_no_compiler_is_named_as_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert "no C++ compiler" in build.plan(tmp_path).missing
    done = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track.native.build"],
        capture_output=True,
        text=True,
        env={**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "GPU_MEM_TRACK_CACHE": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "cannot build the native reader: no C++ compiler found (set CXX, or install g++ or clang++)"
    )


def test_a_big_census_without_the_reader_asks_for_one_build_in_the_background(tmp_path, monkeypatch):
    started = []
    monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "auto")
    monkeypatch.setenv("GPU_MEM_TRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "AUTO_BUILD_TENSORS", 10)
    monkeypatch.setattr(native.subprocess, "Popen", lambda command, **kw: started.append(command) or _Done())
    tensors = [torch.zeros(1) for _ in range(12)]
    with native.use(None):
        native._state.update(loaded=False, requested=False)
        take_census("cpu", lambda: tensors[:5])
        assert started == []  # small: no build
        take_census("cpu", lambda: tensors)
        take_census("cpu", lambda: tensors)
        assert started == [[sys.executable, "-m", "gpu_mem_track.native.build", "--background"]]
        monkeypatch.setenv("GPU_MEM_TRACK_NATIVE", "off")
        native._state.update(requested=False)
        take_census("cpu", lambda: tensors)
        assert len(started) == 1  # off: never


class _Done:
    def poll(self):
        return 0
