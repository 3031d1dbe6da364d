"""Saved activations and inputs: recorded while alive, each storage once, nothing kept alive."""

from __future__ import annotations

import gc
import io
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_mem_track import MemTracker, read_stamps
from gpu_mem_track.tracker.census import full_scan, take_census
from gpu_mem_track.tracker.readers import FakeReader
from gpu_mem_track.tracker.saved import SavedTensorRecorder

MiB = 2**20
SOURCE = Path(__file__).read_text().splitlines()


def line_of(marker: str) -> int:
    """The line of this file holding ``marker`` (in a comment), 1-based."""
    return next(i for i, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# {marker}"))


class Net(nn.Module):
    """x (4, 16) -> Linear(16, 32) -> tanh -> Linear(32, 8), all float32.

    With x not requiring grad, autograd saves: x (for encoder.0's weight gradient), the
    tanh output t (4, 32) = 512 B (tanh saves its result; head saves it as its input),
    and head's weight (for t's gradient). The linear output before tanh is not saved.
    """

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)  # site A
        return self.head(h)  # site B


PARAMS = (16 * 32 + 32 + 32 * 8 + 8) * 4  # 3232 B
X_BYTES = 4 * 16 * 4  # 256 B
T_BYTES = 4 * 32 * 4  # 512 B: saved by tanh and head; gc sees it (see below)
OUT_BYTES = 4 * 8 * 4  # 128 B: saved by pow, and the caller's `out`
TARGET_BYTES = 4 * 8  # int64 labels, saved by nll_loss, and the caller's `target`
# Inside the C++ composite cross_entropy: log_softmax's result (saved by log_softmax and
# nll_loss) and nll_loss's total_weight (a float32 scalar). Neither ever becomes a Python
# object, so gc cannot see them: these are the bytes that would be "hidden" on CUDA.
# (t, a Python object while forward ran, stays visible: torch keeps a tensor's Python
# object alive, gc-tracked, while C++ still holds the tensor.)
HIDDEN_BYTES = 4 * 8 * 4 + 4
ACTIVATION_BYTES = T_BYTES + OUT_BYTES + TARGET_BYTES + HIDDEN_BYTES  # 804 B
LOSS_BYTES = 4
TARGET = (1, 2, 3, 0)
# The tracker names tensors by the caller's function locals only on Python 3.13+, where
# frame.f_locals is a side-effect-free view (PEP 667); on older Pythons reading it would
# store references in the frame and keep deleted tensors alive (see tracker/naming.py).
# So a test function's own locals (x, target, loss, model) name tensors only there.
LOCALS_NAME = sys.version_info >= (3, 13)


def forward(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(x)
    loss = F.cross_entropy(out.pow(2), target)  # site C
    return out, loss


def categories(census):
    return {k: v for k, v in census.categories.by_label().items() if v}


def test_saved_activations_by_category_with_hand_computed_bytes():
    torch.manual_seed(0)
    model, x, target = Net(), torch.randn(4, 16), torch.tensor(TARGET)
    recorder = SavedTensorRecorder()
    recorder.watch(model)
    with recorder:
        out, loss = forward(model, x, target)
    roots = [("", model), ("x", x), ("out", out), ("loss", loss), ("target", target)]
    census = take_census("cpu", lambda: [x, out, loss, target], roots, saved=recorder)
    # The weight head saves stays a Parameter; x, saved by encoder.0, stays an Input;
    # out and target, saved but held under the program's names, stay in their own
    # category (other): only storages nothing else names are Activations.
    assert categories(census) == {
        "parameter": PARAMS,
        "input": X_BYTES,
        "activation": ACTIVATION_BYTES - OUT_BYTES - TARGET_BYTES,
        "other": OUT_BYTES + TARGET_BYTES + LOSS_BYTES,
    }
    assert census.nbytes == census.categories.total == PARAMS + X_BYTES + ACTIVATION_BYTES + LOSS_BYTES
    assert census.views == 0  # the recorder's aliases are not views
    groups = {
        (g.kind, g.shape, g.dtype): (g.count, g.nbytes, set(g.names))
        for g in census.groups
        if g.kind in ("Input", "Activation")
    }
    a, b, c = (f"saved at test_saved.py:{line_of(site)}" for site in ("site A", "site B", "site C"))
    assert groups == {
        ("Input", (4, 16), "float32"): (1, X_BYTES, {"x", "input 0 of Net", f"{a} (encoder.0)"}),
        ("Activation", (4, 32), "float32"): (1, T_BYTES, {f"{a} (encoder.1)", f"{b} (head)"}),
        ("Activation", (4, 8), "float32"): (1, 128, {c}),  # log-probabilities
        ("Activation", (), "float32"): (1, 4, {c}),  # total_weight
    }
    tensors = {(g.shape, g.dtype): set(g.names) for g in census.groups if g.kind == "Tensor"}
    assert tensors[(4, 8), "float32"] == {"out", c} and tensors[(4,), "int64"] == {"target", c}
    loss.backward()
    after = take_census("cpu", lambda: [x, out, loss, target], roots, saved=recorder)
    assert categories(after) == {
        "parameter": PARAMS,
        "gradient": PARAMS,
        "input": X_BYTES,
        "other": OUT_BYTES + TARGET_BYTES + LOSS_BYTES,
    }
    assert len(recorder) == 0


def test_without_the_recorder_the_saved_tensor_is_invisible_and_with_it_counted_once():
    torch.manual_seed(0)
    model, x, target = Net(), torch.randn(4, 16), torch.tensor(TARGET)
    roots = [("", model), ("x", x), ("target", target)]
    recorder = SavedTensorRecorder()
    recorder.watch(model)
    base = take_census("cpu", full_scan, roots).nbytes
    out, loss = forward(model, x, target)
    unrecorded = take_census("cpu", full_scan, roots, saved=recorder).nbytes - base
    del out, loss
    with recorder:
        out, loss = forward(model, x, target)
    recorded_census = take_census("cpu", full_scan, roots, saved=recorder)
    recorded = recorded_census.nbytes - base
    # gc finds out, t and loss either way (and the recorder's aliases too): the difference
    # is what only C++ holds, counted exactly once.
    assert unrecorded == OUT_BYTES + T_BYTES + LOSS_BYTES
    assert recorded - unrecorded == HIDDEN_BYTES
    # target is named (a root): it stays other
    assert recorded_census.categories.activation == ACTIVATION_BYTES - TARGET_BYTES
    del out, loss


@pytest.mark.slow
def test_saved_tensors_vanish_when_the_graph_is_deleted_and_nothing_is_kept_alive():
    model, x, target = Net(), torch.randn(4, 16), torch.tensor(TARGET)
    recorder = SavedTensorRecorder()
    recorder.watch(model)
    with recorder:
        out, loss = forward(model, x, target)
    known = recorder.known_tensors()
    refs = [weakref.ref(k.tensor) for k in known] + [weakref.ref(out), weakref.ref(x), weakref.ref(model)]
    # x, t twice (tanh, head), head.weight.t(), out, log-probabilities twice, target, total_weight
    assert len(recorder) == 9
    del known, out, loss  # no backward: the graph is freed by reference counting alone
    assert len(recorder) == 0
    assert recorder.known_tensors()[0].kind == "Input"
    del x, target, model
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert recorder.known_tensors() == []


def test_results_and_gradients_are_unchanged_double_backward_included():
    def run(recording: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4), nn.Sigmoid())
        x = torch.randn(5, 8, requires_grad=True)
        recorder = SavedTensorRecorder()
        if recording:
            recorder.install()
        try:
            y = model(x).pow(2).sum()
        finally:
            if recording:
                recorder.uninstall()
        (gx,) = torch.autograd.grad(y, x, create_graph=True)
        (gw,) = torch.autograd.grad(gx.pow(2).sum(), model[0].weight)
        return y.detach(), gx.detach(), gw

    for plain, recorded in zip(run(False), run(True)):
        assert torch.equal(plain, recorded)


def test_in_place_modification_of_a_saved_tensor_still_raises():
    z = torch.randn(3, requires_grad=True)
    with SavedTensorRecorder():
        s = z.sigmoid()
    s.mul_(2)
    with pytest.raises(
        RuntimeError, match="modified by an inplace operation.*at version 1; expected version 0"
    ):
        s.sum().backward()


def test_install_nests_and_uninstall_refuses_to_pop_foreign_hooks():
    recorder = SavedTensorRecorder()
    with recorder:
        with recorder:
            assert recorder.installed
        assert recorder.installed
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            with pytest.raises(RuntimeError, match="installed after the recorder's"):
                recorder.uninstall()
    assert not recorder.installed
    with pytest.raises(RuntimeError, match="not installed"):
        recorder.uninstall()


def test_innermost_watched_module_names_the_saved_tensor_and_unwatched_ones_do_not():
    inner = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    outer = nn.Sequential(inner, nn.Sigmoid())
    recorder = SavedTensorRecorder()
    recorder.watch(outer, "model")
    x = torch.randn(2, 4)
    with recorder:
        y = outer(x)  # site D
        z = nn.Tanh()(y)  # site E (an unwatched module)
    names = sorted(k.name for k in recorder.known_tensors() if k.kind == "Activation")
    d, e = line_of("site D"), line_of("site E (an unwatched module)")
    assert names == [
        f"saved at test_saved.py:{d} (model.0.0)",  # x, for the linear's weight gradient
        f"saved at test_saved.py:{d} (model.0.1)",
        f"saved at test_saved.py:{d} (model.1)",
        f"saved at test_saved.py:{e}",
    ]
    del y, z


def test_tracker_reports_categories_in_text_csv_and_dataframe(quiet_tracker):
    torch.manual_seed(0)
    model, x, target = Net(), torch.randn(4, 16), torch.tensor(TARGET)
    live = [x, target]
    stream = io.StringIO()
    tracker = quiet_tracker(
        source=lambda: list(live), reader=FakeReader(rss_bytes=100 * MiB), verbosity=1, stream=stream
    )
    tracker.watch(net=model)
    start_stamp = tracker.track("start")
    with tracker.saved_activations():
        out, loss = forward(model, x, target)
    live += [out, loss]
    tracker.watch(out=out)
    forward_stamp = tracker.track("forward")
    loss.backward()
    backward_stamp = tracker.track("backward")
    a, b, c = line_of("site A"), line_of("site B"), line_of("site C")
    text = stream.getvalue().split("[forward]")[1].split("At ")[0].splitlines()
    total = PARAMS + X_BYTES + ACTIVATION_BYTES + LOSS_BYTES
    assert forward_stamp.ledger.tensors == total
    # out is watched: saved, but held under a name, so it stays other. Where locals name
    # tensors (LOCALS_NAME), target is held under its name too, so it stays other (no
    # change line), and x and loss carry their names.
    held = TARGET_BYTES if LOCALS_NAME else 0
    x_name, loss_name = ("x, ", " | loss") if LOCALS_NAME else ("", "")
    target_lines = [
        f"+ | 1 * Size:(4,)    | Memory: 32 B  | Activation | int64   | saved at test_saved.py:{c}",
        "- | 1 * Size:(4,)    | Memory: 32 B  | Tensor     | int64",
    ]
    assert text[2:] == [
        f"  categories: parameter 3.16 KiB | input 256 B | activation {676 - held} B | other {132 + held} B"
        " = tensors 4.20 KiB",
        f"+ | 1 * Size:(4, 32) | Memory: 512 B | Activation | float32 | saved at test_saved.py:{a}"
        f" (net.encoder.1), saved at test_saved.py:{b} (net.head)",
        f"+ | 1 * Size:(4, 16) | Memory: 256 B | Input      | float32 | {x_name}input 0 of net,"
        f" saved at test_saved.py:{a} (net.encoder.0)",
        "- | 1 * Size:(4, 16) | Memory: 256 B | Tensor     | float32" + (" | x" if LOCALS_NAME else ""),
        f"+ | 1 * Size:(4, 8)  | Memory: 128 B | Activation | float32 | saved at test_saved.py:{c}",
        f"+ | 1 * Size:(4, 8)  | Memory: 128 B | Tensor     | float32 | out, saved at test_saved.py:{c}",
        *([] if LOCALS_NAME else target_lines),
        f"+ | 1 * Size:()      | Memory: 4 B   | Activation | float32 | saved at test_saved.py:{c}",
        "+ | 1 * Size:()      | Memory: 4 B   | Tensor     | float32" + loss_name,
    ]
    assert backward_stamp.ledger.categories.activation == 0
    assert backward_stamp.ledger.categories.gradient == PARAMS
    stamps = [start_stamp, forward_stamp, backward_stamp]
    assert [s.ledger.categories for s in read_stamps(tracker.files.csv)] == [
        s.ledger.categories for s in stamps
    ]
    frame = tracker.to_dataframe()
    totals = frame[frame["row"] == "totals"]
    cats = [c for c in frame.columns if c.startswith("cat_")]
    assert cats == [
        "cat_parameter",
        "cat_buffer",
        "cat_optimizer_state",
        "cat_gradient",
        "cat_input",
        "cat_activation",
        "cat_other",
    ]
    assert totals["cat_activation"].tolist() == [0, ACTIVATION_BYTES - OUT_BYTES - held, 0]
    assert totals["cat_input"].tolist() == [0, X_BYTES, X_BYTES]
    assert (totals[cats].sum(axis=1) == totals["tensors"]).all()
    del out, loss


def test_activations_option_records_until_close():
    model, x, target = Net(), torch.randn(4, 16), torch.tensor(TARGET)
    with MemTracker(device="cpu", out_dir=None, verbosity=0, probe=False, activations=True) as tracker:
        tracker.watch(model)
        out, loss = forward(model, x, target)
        assert tracker.track().ledger.categories.activation >= T_BYTES + OUT_BYTES
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        tracker.close()  # already closed: nothing to pop, no error
    del out, loss
    out, loss = forward(model, x, target)  # after close: nothing recorded
    assert tracker.track().ledger.categories.activation == 0
    del out, loss


def test_saved_tensors_name_the_modules_the_census_found_without_watch():
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    with MemTracker(device="cpu", out_dir=None, verbosity=0, probe=False, activations=True) as tracker:
        tracker.track()  # the census meets the model: later saved tensors name its modules
        out = model(x)
        stamp = tracker.track()
    names = {n for c in stamp.changes if c.kind == "Activation" for n in c.names}
    # Found by the census, the model has no prefix; where locals name tensors
    # (LOCALS_NAME), the local `model` names it first (bound to a name before found).
    prefix = "model." if LOCALS_NAME else ""
    assert any(n.endswith(f"({prefix}1)") for n in names), names
    assert any(n.endswith(f"({prefix}2)") for n in names), names
    del out
