"""The rank of a distributed launch and the launch folder's name (``gpu_mem_track.ranks``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_mem_track.errors import UsageError
from gpu_mem_track.ranks import (
    RankInfo,
    agent_start,
    is_launch_folder,
    launch_name,
    rank_folder,
    rank_folders,
    rank_info,
)

TORCHRUN_ENV = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}


def fake_proc(root: Path, pid: int, ticks: int, boot: int = 1_700_000_000, comm: str = "python3") -> Path:
    """A /proc with ``<pid>/stat`` (start time ``ticks`` after boot) and ``stat`` (btime)."""
    (root / str(pid)).mkdir(parents=True)
    rest = ["S"] + ["0"] * 18 + [str(ticks)] + ["0"] * 10  # fields 3..21, 22 = starttime, ...
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {boot}\nprocesses 9\n")
    return root


def test_rank_info_reads_the_launchers_environment():
    assert rank_info(TORCHRUN_ENV) == RankInfo(rank=1, local_rank=1, world_size=2, run_id="none")
    assert rank_info({"RANK": "3", "WORLD_SIZE": "4"}) == RankInfo(3, 3, 4, "")


def test_rank_info_is_none_outside_a_launch():
    assert rank_info({}) is None
    assert rank_info({"LOCAL_RANK": "0"}) is None


@pytest.mark.parametrize(
    "env",
    [{"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "0", "WORLD_SIZE": "0"}],
)
def test_rank_info_refuses_nonsense(env):
    with pytest.raises(UsageError, match="RANK"):
        rank_info(env)


def test_rank_info_round_trips():
    info = RankInfo(2, 0, 4, "job")
    assert RankInfo.from_dict(info.to_dict()) == info
    assert info.folder_name == "rank2" and not info.is_first and RankInfo(0, 0, 1).is_first


def test_agent_start_reads_proc(tmp_path):
    proc = fake_proc(tmp_path, 4242, ticks=500 * os.sysconf("SC_CLK_TCK"), comm="we ird) name")
    assert agent_start(4242, proc) == 1_700_000_000 + 500
    assert agent_start(4243, proc) is None


def test_agent_start_of_our_parent_is_before_now():
    started = agent_start(os.getppid())
    if started is None:
        pytest.skip("no /proc here")
    assert started <= time.time()


def test_launch_name_follows_the_rule(tmp_path):
    info = rank_info(TORCHRUN_ENV)
    assert launch_name("x/train.py", "my run", info) == "my_run"
    assert launch_name("train.py", None, RankInfo(0, 0, 2, "job-7")) == "train-job-7"
    uuid = RankInfo(0, 0, 2, "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab")
    assert launch_name("train.py", None, uuid) == "train-0f1e2d3c"
    proc = fake_proc(tmp_path, 77, ticks=0, boot=1_700_000_000)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(1_700_000_000))
    assert launch_name("train.py", None, info, {}, ppid=77, proc=proc) == f"train-{stamp}-p77"
    fallback = launch_name("train.py", None, info, {"MASTER_PORT": "29500"}, ppid=78, proc=proc)
    assert fallback == "train-p78-29500"


def test_every_rank_of_a_launch_names_the_same_folder(tmp_path):
    proc = fake_proc(tmp_path / "proc", 77, ticks=123)
    names = {launch_name("t.py", None, RankInfo(k, k, 4, "none"), {}, 77, proc) for k in range(4)}
    assert len(names) == 1
    (tmp_path / "proc2").mkdir()
    other = fake_proc(tmp_path / "proc2", 77, ticks=123 + 5 * os.sysconf("SC_CLK_TCK"))  # pid reused
    assert launch_name("t.py", None, RankInfo(0, 0, 4, "none"), {}, 77, other) not in names


def test_rank_folder_claims_rank_k_in_one_launch_folder(tmp_path):
    out = tmp_path / "reports"
    folders = [rank_folder(out, "run", "t.py", RankInfo(k, k, 2)) for k in (1, 0)]
    assert folders == [out / "run" / "rank1", out / "run" / "rank0"]
    assert all(f.is_dir() for f in folders)
    assert rank_folders(out / "run") == {0: out / "run" / "rank0", 1: out / "run" / "rank1"}
    assert is_launch_folder(out / "run") and not is_launch_folder(out)
    # A second launch of the same name moves on, all its ranks alike.
    again = [rank_folder(out, "run", "t.py", RankInfo(k, k, 2)) for k in (0, 1)]
    assert again == [out / "run-2" / "rank0", out / "run-2" / "rank1"]


def test_rank_folder_skips_a_one_process_run_of_that_name(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "meta.json").write_text("{}")
    assert rank_folder(tmp_path, "run", "t.py", RankInfo(0, 0, 2)) == tmp_path / "run-2" / "rank0"


def test_ranks_imports_no_torch():
    code = "import sys, gpu_mem_track.ranks; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
