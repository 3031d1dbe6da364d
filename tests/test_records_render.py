"""Pure data and rendering: diffs, exact text, CSV and DataFrame agree on hand-built stamps."""

from __future__ import annotations

import csv

import pandas as pd
import pytest

from gpu_mem_track.tracker.csvlog import (
    CATEGORY_COLUMNS,
    COLUMNS,
    append_stamp,
    read_frame,
    read_stamps,
    stamp_rows,
)
from gpu_mem_track.tracker.probe import STAGES, ProbeResult, ProbeStage, run_stages
from gpu_mem_track.tracker.records import (
    Categories,
    Census,
    GroupChange,
    Ledger,
    Skipped,
    Stamp,
    TensorGroup,
    diff_census,
)
from gpu_mem_track.tracker.render import render_probe, render_stamp

MiB = 2**20


def group(kind, shape, count, nbytes, *names):
    return TensorGroup(kind, shape, "float32", "cuda:0", count, nbytes, names)


def test_diff_reports_appearing_growing_and_vanishing_groups_largest_first():
    before = Census(
        "cuda:0", (group("Parameter", (4,), 1, 512, "a"), group("Tensor", (2, 2), 2, 1024, "x", "y"))
    )
    after = Census(
        "cuda:0", (group("Parameter", (4,), 3, 1536, "a", "b", "c"), group("Gradient", (8,), 1, 4 * MiB))
    )
    changes = diff_census(before, after)
    assert [(c.sign, c.kind, c.count_delta, c.bytes_delta, c.names) for c in changes] == [
        ("+", "Gradient", 1, 4 * MiB, ()),
        ("+", "Parameter", 2, 1024, ("b", "c")),
        ("-", "Tensor", -2, -1024, ("x", "y")),
    ]


def test_diff_from_nothing_lists_everything_and_unchanged_groups_are_silent():
    census = Census("cpu", (group("Tensor", (1,), 1, 4),))
    assert [c.count_delta for c in diff_census(None, census)] == [1]
    assert diff_census(census, census) == ()


def cuda_stamp():
    ledger = Ledger(
        device="cuda:0",
        tensors=548 * MiB,
        allocated=550 * MiB,
        requested=549 * MiB,
        reserved=552 * MiB,
        peak_allocated=600 * MiB,
        driver=1100 * MiB,
        driver_source="nvml process",
        context=500 * MiB,
        categories=Categories(parameter=547 * MiB, activation=MiB),
    )
    changes = (
        GroupChange(
            "Parameter",
            (4096, 25088),
            "float32",
            "cuda:0",
            1,
            392 * MiB,
            1,
            392 * MiB,
            ("classifier.0.weight",),
        ),
        GroupChange(
            "Parameter",
            (512, 512, 3, 3),
            "float32",
            "cuda:0",
            7,
            63 * MiB,
            7,
            63 * MiB,
            ("features.21.weight", "features.23.weight", "features.25.weight", "features.28.weight"),
        ),
        GroupChange("Tensor", (1,), "int64", "cuda:0", -3, -1536, 0, 0, ()),
    )
    return Stamp(
        seq=2,
        time=1_700_000_000.5,
        elapsed=1.25,
        file="/home/u/vgg_demo.py",
        line=13,
        function="<module>",
        label="model on device",
        ledger=ledger,
        changes=changes,
        skipped=(Skipped("meta", 2, 800),),
        views=1,
    )


def test_cuda_stamp_renders_exactly():
    assert render_stamp(cuda_stamp()) == (
        "At vgg_demo.py:13 <module> [model on device] | cuda:0 | tensors 548.00 MiB | allocated 550.00 MiB"
        " | reserved 552.00 MiB | driver 1.07 GiB\n"
        "  ledger: tensors 548.00 MiB + hidden 2.00 MiB = allocated 550.00 MiB; + allocator cache 2.00 MiB"
        " = reserved 552.00 MiB; + framework 548.00 MiB (CUDA context 500.00 MiB, libraries and other"
        " 48.00 MiB) = driver 1.07 GiB | peak allocated 600.00 MiB\n"
        "  categories: parameter 547.00 MiB | activation 1.00 MiB | hidden 2.00 MiB"
        " | allocator cache 2.00 MiB | framework 548.00 MiB = driver 1.07 GiB\n"
        "  not counted: 2 meta tensors (800 B nominal); 1 view of counted storages\n"
        "+ | 1 * Size:(4096, 25088)    | Memory: 392.00 MiB | Parameter | float32 | classifier.0.weight\n"
        "+ | 7 * Size:(512, 512, 3, 3) | Memory: 63.00 MiB  | Parameter | float32 | features.21.weight,"
        " features.23.weight, features.25.weight, ... (+1 more)\n"
        "- | 3 * Size:(1,)             | Memory: 1.50 KiB   | Tensor    | int64\n"
    )


def test_totals_only_and_cpu_rendering():
    ledger = Ledger(device="cpu", tensors=1536, rss=300 * MiB, categories=Categories(other=1024, input=512))
    stamp = Stamp(
        1,
        0.0,
        0.0,
        "train.py",
        7,
        "step",
        "",
        ledger,
        (GroupChange("Tensor", (), "float32", "cpu", 1, 4, 1, 4, ("loss",)),),
    )
    assert render_stamp(stamp, detail=False) == (
        "At train.py:7 step | cpu | tensors 1.50 KiB | process RSS 300.00 MiB\n"
        "  ledger: CPU tensors 1.50 KiB of process RSS 300.00 MiB (no allocator statistics on CPU)\n"
        "  categories: input 512 B | other 1.00 KiB = tensors 1.50 KiB\n"
    )
    assert render_stamp(stamp).endswith("+ | 1 * Size:() | Memory: 4 B | Tensor | float32 | loss\n")


def test_ledger_parts_add_up_to_the_driver_figure():
    ledger = cuda_stamp().ledger
    assert sum(ledger.parts().values()) == ledger.driver
    assert ledger.context + ledger.framework_other == ledger.framework
    assert sum(ledger.breakdown().values()) == ledger.total == ledger.driver


@pytest.mark.parametrize(
    ("ledger", "total_name", "line"),
    [
        (
            Ledger("cuda:0", 512, allocated=1024, reserved=2048, categories=Categories(input=512)),
            "reserved",
            "categories: input 512 B | hidden 512 B | allocator cache 1.00 KiB = reserved 2.00 KiB",
        ),
        (Ledger("cuda:0", 0, categories=Categories()), "tensors", "categories: none = tensors 0 B"),
        (Ledger("cpu", 7, categories=Categories(gradient=3, other=4)), "tensors", None),
    ],
)
def test_categories_and_known_parts_add_up_to_the_furthest_known_figure(ledger, total_name, line):
    assert ledger.total_name == total_name
    assert sum(ledger.breakdown().values()) == ledger.total
    text = render_stamp(Stamp(1, 0.0, 0.0, "a.py", 1, "f", "", ledger), detail=False)
    if line is not None:
        assert text.splitlines()[2] == "  " + line


def test_categories_must_add_up_to_the_tensor_total():
    with pytest.raises(ValueError, match="categories add up to 12 B, not tensors 13 B"):
        Ledger("cpu", 13, categories=Categories(parameter=12))
    census = Census("cpu", (group("Activation", (2,), 1, 8), group("Parameter", (1,), 2, 8)))
    assert census.categories == Categories(parameter=8, activation=8)
    assert census.categories.total == census.nbytes


def test_csv_round_trip_and_dataframe_agree(tmp_path):
    stamps = [cuda_stamp(), Stamp(3, 1.0, 2.0, "a.py", 1, "f", "", Ledger("cpu", 0, rss=10))]
    path = tmp_path / "run.csv"
    for stamp in stamps:
        append_stamp(path, stamp)
    assert read_stamps(path) == stamps
    frame = pd.read_csv(path)
    assert list(frame.columns) == list(COLUMNS)
    totals = frame[frame["row"] == "totals"]
    assert totals["framework"].tolist()[0] == 548 * MiB
    assert totals["cat_parameter"].tolist()[0] == 547 * MiB and totals["cat_activation"].tolist()[0] == MiB
    assert pd.isna(totals["cat_parameter"].tolist()[1])  # a ledger without categories
    changes = frame[frame["row"] == "change"]
    assert changes["shape"].tolist() == ["4096x25088", "512x512x3x3", "1"]
    assert changes["bytes_delta"].sum() == sum(c.bytes_delta for c in stamps[0].changes)
    assert len(stamp_rows(stamps[0])) == 1 + len(stamps[0].changes)


def test_reports_without_category_columns_still_read(tmp_path):
    new, old = tmp_path / "new.csv", tmp_path / "old.csv"
    append_stamp(new, cuda_stamp())
    with new.open(newline="") as source, old.open("w", newline="") as target:
        rows = list(csv.DictReader(source))
        kept = [c for c in COLUMNS if c not in CATEGORY_COLUMNS]
        writer = csv.DictWriter(target, fieldnames=kept, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (stamp,) = read_stamps(old)
    assert stamp.ledger.categories is None
    assert stamp.ledger.breakdown()["tensors"] == 548 * MiB
    assert stamp == Stamp.from_dict(
        {**cuda_stamp().to_dict(), "ledger": {**cuda_stamp().to_dict()["ledger"], "categories": None}}
    )
    frame = read_frame(old)
    assert list(frame.columns) == list(COLUMNS) and frame[list(CATEGORY_COLUMNS)].isna().all().all()


def test_stamp_dict_round_trip():
    stamp = cuda_stamp()
    assert Stamp.from_dict(stamp.to_dict()) == stamp


def fake_probe():
    readings = iter([(900 * MiB, 0), (1400 * MiB, 2 * MiB), (1430 * MiB, 12 * MiB), (1500 * MiB, 14 * MiB)])
    stages = run_stages(
        lambda: (*next(readings), "nvml device-wide"), dict.fromkeys(STAGES[1:], lambda: None)
    )
    return ProbeResult("cuda:0", "Fake GPU", "nvml device-wide", "2.13.0", tuple(stages))


def test_probe_costs_subtract_what_the_allocator_reserved():
    result = fake_probe()
    assert result.costs() == {
        "CUDA context": 498 * MiB,
        "first cuBLAS matmul": 20 * MiB,
        "first cuDNN convolution": 68 * MiB,
    }
    assert result.context == 498 * MiB
    assert result.total == 586 * MiB
    assert ProbeResult.from_dict(result.to_dict()) == result
    assert result.stages[0] == ProbeStage("before CUDA", 900 * MiB, 0)


def test_probe_renders_a_table():
    assert render_probe(fake_probe()) == (
        "CUDA framework cost on cuda:0 (Fake GPU); driver memory from nvml device-wide; torch 2.13.0\n"
        "  stage                    driver      allocator reserved  cost outside the allocator\n"
        "  before CUDA              900.00 MiB  0 B\n"
        "  CUDA context             1.37 GiB    2.00 MiB            498.00 MiB\n"
        "  first cuBLAS matmul      1.40 GiB    12.00 MiB           20.00 MiB\n"
        "  first cuDNN convolution  1.46 GiB    14.00 MiB           68.00 MiB\n"
        "  framework cost in all: 586.00 MiB\n"
    )


def test_records_a_user_sees_have_one_short_line_repr():
    stamp = cuda_stamp()
    census = Census("cuda:0", tuple(group("Parameter", (4,), 1, 512, f"w{i}") for i in range(50)))
    assert repr(stamp) == (
        "<Stamp #2 vgg_demo.py:13 'model on device': cuda:0 tensors 548.00 MiB, allocated 550.00 MiB,"
        " reserved 552.00 MiB, driver 1.07 GiB; 3 changes>"
    )
    assert repr(stamp.ledger) == (
        "<Ledger cuda:0 tensors 548.00 MiB, allocated 550.00 MiB, reserved 552.00 MiB, driver 1.07 GiB>"
    )
    assert repr(census) == "<Census cuda:0: 25.00 KiB in 50 storages, 50 groups>"
    assert repr(stamp.changes[1]) == (
        "<GroupChange +7 Parameter (512, 512, 3, 3) float32 cuda:0: +63.00 MiB"
        " ('features.21.weight', 'features.23.weight', ... +2 more)>"
    )
    assert repr(census.groups[0]) == "<TensorGroup Parameter (4,) float32 cuda:0: 1 x, 512 B ('w0')>"
    for record in (stamp, stamp.ledger, census, *stamp.changes, *census.groups):
        assert "\n" not in repr(record) and len(repr(record)) < 160


def test_a_label_with_newlines_keeps_the_report_one_line_per_stamp_and_the_csv_faithful(tmp_path):
    import dataclasses

    label = "epoch 1\nbatch 2\r\n\tdone\x1b"
    stamp = dataclasses.replace(cuda_stamp(), label=label)
    text = render_stamp(stamp)
    escaped = "[epoch 1\\nbatch 2\\r\\n\\tdone\\x1b]"
    assert text.splitlines()[0].startswith(f"At vgg_demo.py:13 <module> {escaped} |")
    assert len(text.splitlines()) == len(render_stamp(cuda_stamp()).splitlines())
    path = tmp_path / "r.csv"
    append_stamp(path, stamp)
    assert read_stamps(path)[0].label == label
    assert read_frame(path)["label"].tolist()[0] == label
