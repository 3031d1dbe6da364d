"""The probe's subprocess handling and cache, and watch()/file-name edge cases."""

from __future__ import annotations

import subprocess
import sys
import weakref

import pytest
from torch import nn

from gpu_mem_track.outputs import safe_name
from gpu_mem_track.tracker import probe
from gpu_mem_track.tracker.naming import Registry

MiB = 2**20


def fake_child(monkeypatch, returncode, stdout, stderr=""):
    calls = []

    def fake_run(command, **kwargs):
        calls.append((command, kwargs["env"]))
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)

    monkeypatch.setattr(probe.subprocess, "run", fake_run)
    return calls


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "message"),
    [
        (2, "", "CUDA is not available on this machine\n", "CUDA is not available on this machine"),
        (0, "", "", "the probe subprocess printed no result"),
        (0, "{not json\n", "", "the probe subprocess printed no result"),
        (0, '{"device": "cuda:0"}\n', "", "the probe subprocess printed no result"),
    ],
)
def test_probe_failures_become_probe_errors(monkeypatch, returncode, stdout, stderr, message):
    fake_child(monkeypatch, returncode, stdout, stderr)
    with pytest.raises(probe.ProbeError, match=message):
        probe.run_probe("cuda:0")


def test_probe_child_sees_the_gpu_by_uuid_and_finds_the_package(monkeypatch, probe_result):
    import json

    calls = fake_child(monkeypatch, 0, json.dumps(probe_result.to_dict()) + "\n")
    result = probe.run_probe("cuda:3", uuid="1234-abcd")
    command, env = calls[0]
    assert command[-2:] == ["cuda:0", "GPU-1234-abcd"] and env["CUDA_VISIBLE_DEVICES"] == "GPU-1234-abcd"
    assert probe.__file__.rsplit("/gpu_mem_track/", 1)[0] in env["PYTHONPATH"]
    assert result.device == "cuda:3" and result.context == 500 * MiB


def test_cached_probe_measures_once_then_reads_the_disk_cache(monkeypatch, tmp_path, probe_result):
    measured = []
    monkeypatch.setattr(probe, "run_probe", lambda device, uuid=None: measured.append(device) or probe_result)
    monkeypatch.setattr(probe, "_MEMORY_CACHE", {})
    assert probe.cached_probe("cuda:0", "uuid-1", cache_dir=tmp_path) == probe_result
    monkeypatch.setattr(probe, "_MEMORY_CACHE", {})  # a new process: only the disk cache is left
    assert probe.cached_probe("cuda:0", "uuid-1", cache_dir=tmp_path) == probe_result
    assert measured == ["cuda:0"]
    assert len(list(tmp_path.glob("probe-uuid-1-torch*.json"))) == 1


def test_watch_ignores_repeats_and_rejects_proxies():
    registry = Registry()
    model = nn.Linear(1, 1)
    registry.add(model)
    registry.add(model)
    assert registry.roots() == [("", model)]
    with pytest.raises(TypeError, match="not CallableProxyType"):
        registry.add(weakref.proxy(model))
    with pytest.raises(TypeError, match="not int"):
        registry.add(3)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("fp32: batch 32/64", "fp32_batch_32_64"),
        ("CON", "run_CON"),
        ("nul.txt", "run_nul.txt"),
        (":::", "run"),
        ("x" * 300, "x" * 100),
    ],
)
def test_safe_names(text, name):
    assert safe_name(text) == name


@pytest.mark.parametrize(
    ("argv0", "stem"),
    [("-", "stdin"), ("<stdin>", "stdin"), ("-c", "python"), ("", "python"), ("dir/train.py", "train")],
)
def test_default_run_names_never_start_with_a_dash(monkeypatch, argv0, stem):
    from gpu_mem_track.outputs import default_run_name

    monkeypatch.setattr(sys, "argv", [argv0])
    assert default_run_name(0.0).startswith(f"{stem}-") and default_run_name(0.0).count("-") == 2


def test_safe_names_never_start_with_a_dash():
    assert safe_name("--x") == "x" and safe_name("-") == "run"


def test_a_probe_measured_by_device_name_is_found_by_uuid_and_by_name(monkeypatch, tmp_path, probe_result):
    import dataclasses

    measured = dataclasses.replace(probe_result, uuid="abcd-1234")
    calls = []
    monkeypatch.setattr(probe, "run_probe", lambda device, uuid=None: calls.append(device) or measured)
    monkeypatch.setattr(probe, "_MEMORY_CACHE", {})
    probe.cached_probe("cuda:0", cache_dir=tmp_path)  # before CUDA starts: no UUID known
    monkeypatch.setattr(probe, "_MEMORY_CACHE", {})
    assert probe.load_probe("cuda:0", "abcd-1234", cache_dir=tmp_path).context == 500 * MiB  # track()
    assert probe.cached_probe("cuda:0", cache_dir=tmp_path).context == 500 * MiB  # the next demo
    assert calls == ["cuda:0"]
    assert probe.load_probe("cuda:1", "other-gpu", cache_dir=tmp_path) is None
