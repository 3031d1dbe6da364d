"""One device parser: every accepted form, every rejected one with its message."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpu_mem_track.devices import DEVICE_FORMS, Device, parse_device
from gpu_mem_track.errors import UsageError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("cpu", Device("cpu")),
        ("cpu:0", Device("cpu")),
        ("cuda", Device("cuda")),
        ("cuda:0", Device("cuda", 0)),
        (" cuda:12 ", Device("cuda", 12)),
        (0, Device("cuda", 0)),
        (3, Device("cuda", 3)),
        (torch.device("cuda", 2), Device("cuda", 2)),
        (torch.device("cuda"), Device("cuda")),
        (torch.device("cpu"), Device("cpu")),
        (Device("cuda", 1), Device("cuda", 1)),
    ],
)
def test_every_form_parses_to_one_record(value, expected):
    assert parse_device(value) == expected


def test_the_record_prints_as_torch_spells_it_and_is_frozen():
    assert [str(Device("cpu")), str(Device("cuda")), str(Device("cuda", 1))] == ["cpu", "cuda", "cuda:1"]
    assert str(torch.device(str(Device("cuda", 1)))) == "cuda:1"
    assert Device("cuda").with_index(0) == Device("cuda", 0)
    assert Device("cuda", 3).with_index(0) == Device("cuda", 3)
    assert Device("cpu").with_index(0) == Device("cpu")
    assert (Device("cuda").ordinal, Device("cuda", 3).ordinal, Device("cuda", 3).is_cuda) == (0, 3, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Device("cpu").type = "cuda"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu7", "not a device: 'gpu7'"),
        ("cuda:x", "not a device: 'cuda:x'"),
        ("cuda:-1", "not a device: 'cuda:-1'"),
        ("cpu:1", "not a device: 'cpu:1'"),
        ("", "not a device: ''"),
        (torch.device("meta"), "not a device: device(type='meta')"),
        (-1, "a CUDA index >= 0, not -1"),
        (True, "a CUDA index >= 0, not True"),
        (1.5, "not a device: 1.5"),
        (None, "not a device: None"),
    ],
)
def test_bad_values_are_named_with_the_valid_forms(value, message):
    with pytest.raises(UsageError) as caught:
        parse_device(value)
    assert message in str(caught.value)
    assert str(caught.value).endswith(f"(valid forms: {DEVICE_FORMS})")


def test_a_duck_typed_device_needs_no_torch():
    class Like:
        type, index = "cuda", 4

    assert parse_device(Like()) == Device("cuda", 4)


def test_the_runner_resolves_its_device_with_the_same_parser(monkeypatch):
    from gpu_mem_track.runner import checks

    monkeypatch.setattr(checks, "driver_gpu_count", lambda: 2)
    assert [str(checks.resolve_device(d)) for d in ("auto", "cpu", "cuda", "cuda:1")] == [
        "cuda:0",
        "cpu",
        "cuda:0",
        "cuda:1",
    ]
    with pytest.raises(UsageError, match=r"--device takes auto, cpu, cuda or cuda:N, not 'gpu'"):
        checks.resolve_device("gpu")
    monkeypatch.setattr(checks, "driver_gpu_count", lambda: 0)
    assert str(checks.resolve_device("auto")) == "cpu"
    with pytest.raises(UsageError, match="--device cuda:1: no NVIDIA GPU is visible here"):
        checks.resolve_device("cuda:1")
