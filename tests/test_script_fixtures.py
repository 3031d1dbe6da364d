"""scripts/_common/fixtures.py names the shared fixture folder the same way from a main checkout
and from a worktree one level further down, so a committed report does not depend on
which of the two wrote it."""

from __future__ import annotations

import importlib.util
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


def test_a_given_h200_folder_without_the_recording_is_refused(tmp_path, fixtures_module):
    # a wrong --fixtures must not fall back to the shared folder and overwrite the report
    (tmp_path / "shared/fixtures/h200/real").mkdir(parents=True)
    (tmp_path / "shared/fixtures/h200/real/timm-resnet50-amp.json").write_text("{}")
    fixtures_module.ROOT = tmp_path / "main"
    needs = ["real/timm-resnet50-amp.json"]
    assert fixtures_module.h200_folder(None, needs) == tmp_path / "shared/fixtures/h200"
    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(SystemExit, match="real/timm-resnet50-amp.json not there"):
        fixtures_module.h200_folder(given, needs)
    (given / "real").mkdir()
    (given / "real" / "timm-resnet50-amp.json").write_text("{}")
    assert fixtures_module.h200_folder(given, needs) == given
