"""The one "claim a folder" rule every producer uses (``outputs.claim_folder``)."""

from __future__ import annotations

import pytest

from gpu_mem_track.errors import UsageError
from gpu_mem_track.outputs import claim_folder


def test_a_name_taken_moves_on_to_the_next_suffix(tmp_path):
    assert claim_folder(tmp_path, "run") == tmp_path / "run"
    assert claim_folder(tmp_path, "run") == tmp_path / "run-2"
    assert claim_folder(tmp_path, "run") == tmp_path / "run-3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run-2", "run-3"]
    assert list((tmp_path / "run").iterdir()) == []  # the write check leaves nothing behind


def test_an_inner_folder_shares_its_parent_and_skip_passes_a_candidate_over(tmp_path):
    assert claim_folder(tmp_path, "launch", inner="rank0") == tmp_path / "launch" / "rank0"
    assert claim_folder(tmp_path, "launch", inner="rank1") == tmp_path / "launch" / "rank1"
    assert claim_folder(tmp_path, "launch", inner="rank0") == tmp_path / "launch-2" / "rank0"
    (tmp_path / "solo").mkdir()
    (tmp_path / "solo" / "meta.json").write_text("{}")
    found = claim_folder(tmp_path, "solo", inner="rank0", skip=lambda p: (p / "meta.json").exists())
    assert found == tmp_path / "solo-2" / "rank0"


def test_an_output_path_that_is_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "out").write_text("")
    with pytest.raises(UsageError, match="it is a file, not a folder"):
        claim_folder(tmp_path / "out", "run")
