"""The distributed estimator against 2 real CPU ranks (gloo, torchrun): slow."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check" / "check_estimator_dist.py"


def _check_script():
    spec = importlib.util.spec_from_file_location("check_estimator_dist", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_two_gloo_ranks_match_the_estimate():
    pytest.importorskip("torch.distributed")
    rows = _check_script().compare(2, ["mlp:ddp", "mlp:zero1", "mlp:fsdp"])
    by_case = {(r["case"], r["rank"]): r for r in rows}
    assert len(by_case) == 6
    for rank in (0, 1):
        ddp = by_case["mlp:ddp", rank]
        assert ddp["estimated"] == ddp["measured"]  # DDP: equal to the byte
        # FSDP2: gloo runs collectives on its own thread, which may hold a buffer a
        # little longer than the estimate assumes (see reports/estimator_dist.md)
        fsdp = by_case["mlp:fsdp", rank]
        assert fsdp["estimated"] <= fsdp["measured"] <= fsdp["estimated"] * 1.08
    assert by_case["mlp:zero1", 0]["estimated"] == by_case["mlp:zero1", 0]["measured"]
