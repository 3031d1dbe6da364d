"""One vocabulary of byte categories for the census and the estimator."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from torch import nn

from gpu_mem_track import estimate
from gpu_mem_track.categories import CATEGORIES, LABELS, LEGACY_NAMES
from gpu_mem_track.estimator.records import Breakdown, Estimate
from gpu_mem_track.tracker.csvlog import CATEGORY_COLUMNS
from gpu_mem_track.tracker.records import CATEGORY_LABELS, KINDS, Categories, Ledger


def test_census_and_estimator_records_have_the_same_fields_in_the_same_order():
    assert tuple(f.name for f in fields(Categories)) == CATEGORIES
    assert tuple(f.name for f in fields(Breakdown)) == CATEGORIES
    assert CATEGORY_COLUMNS == tuple(f"cat_{name}" for name in CATEGORIES)
    assert list(CATEGORY_LABELS) == list(KINDS)
    assert list(CATEGORY_LABELS.values()) == [LABELS[name] for name in CATEGORIES]


def test_census_kinds_map_onto_the_categories():
    by_kind = {"Parameter": 1, "Optimizer state": 2, "Tensor": 4, "Mystery": 8}
    assert Categories.from_kinds(by_kind) == Categories(parameter=1, optimizer_state=2, other=12)


def _net():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def test_an_estimate_saved_with_the_older_names_still_loads():
    est = estimate(_net, (4, 8), device="cpu")
    data = json.loads(json.dumps(est.to_dict()))
    assert list(data["at_peak"]) == list(CATEGORIES)
    renamed = {new: old for old, new in LEGACY_NAMES.items()}
    data["at_peak"] = {renamed[name]: value for name, value in data["at_peak"].items()}
    assert "temporaries" in data["at_peak"]
    assert Estimate.from_dict(data) == est


def test_older_names_still_read_and_unknown_names_are_refused():
    parts = Breakdown(parameter=1, buffer=2, optimizer_state=3, gradient=4, input=5, activation=6, other=7)
    assert [getattr(parts, old) for old in LEGACY_NAMES] == [1, 2, 4, 3, 5, 6, 7]
    assert parts.total == 28 and parts.by_label()["optimizer state"] == 3
    assert Breakdown.from_dict(parts.to_dict()) == parts
    with pytest.raises(ValueError, match="unknown byte categories: weights"):
        Breakdown.from_dict({"weights": 1})


def test_census_categories_round_trip_and_sum_like_the_ledger_expects():
    categories = Categories(parameter=8, other=4)
    assert Categories.from_dict(categories.to_dict()) == categories
    assert Ledger(device="cpu", tensors=12, categories=categories).breakdown() == {
        "parameter": 8,
        "buffer": 0,
        "optimizer state": 0,
        "gradient": 0,
        "input": 0,
        "activation": 0,
        "other": 4,
    }
