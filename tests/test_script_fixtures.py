"""scripts/_common/fixtures.py names the shared fixture folder the same way from a main checkout
and from a worktree one level further down, so a committed report does not depend on
which of the two wrote it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "_common" / "fixtures.py"


@pytest.fixture
def fixtures_module():
    spec = importlib.util.spec_from_file_location("scripts_fixtures_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("checkout", ["main", "wt/review"])
def test_a_shared_fixture_is_named_from_the_main_checkouts_place(tmp_path, fixtures_module, checkout):
    (tmp_path / "shared/fixtures/h200").mkdir(parents=True)
    root = tmp_path / checkout
    (root / "reports").mkdir(parents=True)
    fixtures_module.ROOT = root
    assert fixtures_module.shown(tmp_path / "shared/fixtures/h200") == "../shared/fixtures/h200"
    assert fixtures_module.shown(root / "reports" / "x.md") == "reports/x.md"


def test_a_folder_outside_shared_stays_relative_to_the_checkout(tmp_path, fixtures_module):
    (tmp_path / "elsewhere").mkdir()
    fixtures_module.ROOT = tmp_path / "wt" / "review"
    fixtures_module.ROOT.mkdir(parents=True)
    assert fixtures_module.shown(tmp_path / "elsewhere") == "../../elsewhere"


def test_check_resnet_refuses_a_given_folder_without_the_recording(tmp_path, monkeypatch):
    # a wrong --fixtures must not fall back to the shared folder and overwrite the report
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts scripts/ there for _common
    path = SCRIPT.parents[1] / "check" / "check_resnet.py"
    spec = importlib.util.spec_from_file_location("check_resnet_under_test", path)
    check_resnet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_resnet)
    with pytest.raises(SystemExit, match="no real/timm-resnet50-amp.json there"):
        check_resnet.h200_folder(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "timm-resnet50-amp.json").write_text("{}")
    assert check_resnet.h200_folder(tmp_path) == tmp_path
