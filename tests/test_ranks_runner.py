"""The runner and the tracker in a distributed launch, in process: the rank from an
injected environment, the launch folder, the rank columns, the ranks table, the device
each rank measures (through a fake ``torch.cuda`` shaped as the real one), SIGTERM."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from pathlib import Path

import pytest

from gpu_mem_track.ranks import RankInfo, rank_device
from gpu_mem_track.runfolder.files import TIMELINE_COLUMNS, read_lines, read_meta, read_timeline
from gpu_mem_track.runfolder.ranktable import RANK_COLUMNS, read_launch
from gpu_mem_track.runfolder.render import render_ranks
from gpu_mem_track.runner.options import RunOptions
from gpu_mem_track.runner.run import execute, prepare
from gpu_mem_track.runner.samplers import CudaSampler

SCRIPT = """
data = [bytearray(1 << 20) for _ in range({n})]
print("done")
"""


def env(rank: int, world: int = 2) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "TORCHELASTIC_RUN_ID": "none",
    }


def launch(tmp_path: Path, rank: int, world: int = 2, n: int = 4, wait: float = 0.0, **options):
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(textwrap.dedent(SCRIPT.format(n=n)))
    # The script allocates host memory: measure the CPU on any machine (on one with a GPU the
    # automatic device is each rank's cuda:<local rank>, whose allocator the script leaves idle).
    options.setdefault("device", "cpu")
    run_options = RunOptions(str(script), out_dir=str(tmp_path / "reports"), rank_wait=wait, **options)
    out = io.StringIO()
    result = execute(prepare(run_options, env(rank, world)), out)
    return result, out.getvalue()


def test_ranks_write_one_launch_folder_and_rank_0_prints_the_table(tmp_path):
    first, quiet = launch(tmp_path, 1)
    second, loud = launch(tmp_path, 0)
    folder = first.folder.parent
    assert (first.folder.name, second.folder) == ("rank1", folder / "rank0")
    assert folder.name.startswith("train-") and folder.parent == tmp_path / "reports"
    assert quiet == ""
    assert "rank 0 of 2" in loud and f"Ranks of {folder}" in loud
    meta = read_meta(first.folder / "meta.json")
    assert (meta.rank, meta.local_rank, meta.world_size, meta.launch) == (1, 1, 2, folder.name)
    assert meta.run_name == f"{folder.name}/rank1" and meta.end_memory is not None
    assert {row.rank for row in read_timeline(first.folder / "timeline.csv")} == {1}
    with (first.folder / "timeline.csv").open(newline="") as handle:
        raw = list(csv.reader(handle))[1:]  # the hot path's rows and the event rows alike
    assert {len(row) for row in raw} == {len(TIMELINE_COLUMNS)} and {row[-1] for row in raw} == {"1"}
    assert {row[2] for row in raw} >= {"start", "line", "end"}
    assert {record.rank for record in read_lines(first.folder / "lines.csv")} == {1}
    with (folder / "ranks.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == RANK_COLUMNS
    assert [(row["rank"], row["status"]) for row in rows] == [("0", "ok"), ("1", "ok")]
    assert rows[0]["peak"] == str(read_meta(second.folder / "meta.json").peak)
    assert "Spread: largest peak / smallest" in (folder / "report.txt").read_text()


def test_all_ranks_print_when_asked(tmp_path):
    _, text = launch(tmp_path, 1, all_ranks=True)
    assert "rank 1 of 2" in text and "Ranks of" not in text


def test_a_rank_without_a_clean_end_is_marked_and_a_missing_one_listed(tmp_path):
    result, _ = launch(tmp_path, 0, world=3)
    folder = result.folder.parent
    (folder / "rank1").mkdir()
    meta = json.loads((result.folder / "meta.json").read_text())
    meta.update(rank=1, ended=None, exit_code=None)  # killed: the start's meta.json only
    (folder / "rank1" / "meta.json").write_text(json.dumps(meta))
    summary = read_launch(folder)
    assert [r.status for r in summary.ranks] == ["ok", "no end", "missing"]
    assert not summary.complete and summary.world_size == 3
    assert "No clean end recorded for rank 1, 2" in render_ranks(summary)


def test_the_ranks_table_renders_exactly(tmp_path):
    from gpu_mem_track.runfolder.ranktable import LaunchSummary, RankSummary

    summary = LaunchSummary(
        "t-1",
        "t.py",
        2,
        (
            RankSummary(0, "ok", "cuda:0", 3 << 30, "t.py:9", "backward", 1 << 30, 0),
            RankSummary(1, "exit 143", "cuda:1", 2 << 30, "t.py:7", "", None, 143),
        ),
    )
    assert render_ranks(summary) == (
        "Rank  Status    Device          Peak       At end  Peak at (phase)\n"
        "==================================================================\n"
        "   0  ok        cuda:0      3.00 GiB     1.00 GiB  t.py:9 (backward)\n"
        "   1  exit 143  cuda:1      2.00 GiB            -  t.py:7\n"
        "Spread: largest peak / smallest = 1.500 (rank 0 / rank 1)\n"
    )
    assert summary.spread == 1.5


@pytest.mark.parametrize(
    ("peaks", "said"),
    [
        ((2 << 30, 2 << 30), "= 1.000 (all 2 ranks peaked at 2.00 GiB)"),
        ((3 << 30, 2 << 30, 3 << 30), "= 1.500 (rank 0, 2 / rank 1)"),
        ((3 << 30, None), "= 1.000 (one rank with a peak: rank 0)"),
    ],
)
def test_the_spread_names_tied_ranks_and_never_a_rank_against_itself(peaks, said):
    from gpu_mem_track.runfolder.ranktable import LaunchSummary, RankSummary

    ranks = tuple(RankSummary(k, "ok", f"cuda:{k}", p, "t.py:9", "", None, 0) for k, p in enumerate(peaks))
    text = render_ranks(LaunchSummary("t-1", "t.py", len(peaks), ranks))
    assert f"Spread: largest peak / smallest {said}\n" in text
    assert "(rank 0 / rank 0)" not in text


def test_sigterm_in_a_launch_ends_the_script_and_keeps_its_reports(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal\nx = bytearray(1 << 20)\nos.kill(os.getpid(), signal.SIGTERM)\ny = 1\n"
    )
    result, _ = launch(tmp_path, 1)
    assert result.exit_code == 143
    meta = read_meta(result.folder / "meta.json")
    assert meta.exit_code == 143 and meta.ended is not None
    assert read_launch(result.folder.parent).ranks[1].status == "exit 143"


def test_old_timeline_and_lines_files_without_rank_still_read(tmp_path):
    result, _ = launch(tmp_path, 1)
    for name in ("timeline.csv", "lines.csv"):
        path = result.folder / name
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
        cut = rows[0].index("rank")  # files from before ranks had neither it nor later columns
        path.write_text("".join(",".join(row[:cut]) + "\n" for row in rows))
    assert TIMELINE_COLUMNS[-1] == "rank"
    assert {row.rank for row in read_timeline(result.folder / "timeline.csv")} == {None}
    assert {record.rank for record in read_lines(result.folder / "lines.csv")} == {None}


class FakeCuda:
    """``torch.cuda`` as the sampler reads it: initialised or not, the current device,
    the device count, and ``memory_stats_as_nested_dict(index)`` shaped as the
    allocator's nested statistics (``allocated_bytes``/``reserved_bytes``/``allocation``
    -> ``all`` -> ``current``/``peak``/``allocated``/``freed``)."""

    def __init__(self, current: int, count: int) -> None:
        self.initialized, self.current, self.count, self.asked = False, current, count, []

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        return self.current

    def device_count(self) -> int:
        return self.count

    def memory_stats_as_nested_dict(self, index: int) -> dict:
        self.asked.append(index)
        pool = {"current": 100 * (index + 1), "peak": 200 * (index + 1), "allocated": 0, "freed": 0}
        stat = {"all": pool, "large_pool": pool, "small_pool": dict.fromkeys(pool, 0)}
        calls = {"current": 1, "peak": 1, "allocated": 1, "freed": 0}
        counts = {"all": calls, "large_pool": calls, "small_pool": dict.fromkeys(calls, 0)}
        return {"allocated_bytes": stat, "reserved_bytes": stat, "allocation": counts, "num_alloc_retries": 0}


class FakeTorch:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self._C = object()  # no _cuda_memoryStats: the sampler uses memory_stats_as_nested_dict


class NoReader:
    def driver(self, device):
        return None

    def rss(self):
        return None


@pytest.mark.parametrize(
    ("current", "count", "local_rank", "expected"),
    [(1, 2, 1, 1), (0, 2, 1, 1), (0, 1, 1, 0), (3, 4, 1, 3)],
    ids=["set_device", "cuda-local-rank-tensors", "one-visible-device", "script-chose-another"],
)
def test_rank_device(current, count, local_rank, expected):
    assert rank_device(FakeCuda(current, count), local_rank) == expected


def test_the_cuda_sampler_follows_the_ranks_device_once_cuda_starts():
    cuda = FakeCuda(current=0, count=2)
    sampler = CudaSampler("cuda:1", NoReader(), local_rank=1, torch_module=FakeTorch(cuda))
    assert sampler.device == "cuda:1"
    assert sampler.sample() == (0, 0) and cuda.asked == []  # the script has not started CUDA
    cuda.initialized = True
    cuda.current = 1  # torch.cuda.set_device(1)
    assert sampler.sample() == (200, 400) and cuda.asked == [1]
    assert sampler.device == "cuda:1"


def test_the_cuda_sampler_of_a_rank_seeing_one_device_reads_device_0():
    cuda = FakeCuda(current=0, count=1)
    cuda.initialized = True
    sampler = CudaSampler("cuda:3", NoReader(), local_rank=3, torch_module=FakeTorch(cuda))
    assert sampler.sample() == (100, 200) and sampler.device == "cuda:0"


def test_a_named_device_is_not_followed():
    cuda = FakeCuda(current=1, count=2)
    cuda.initialized = True
    sampler = CudaSampler("cuda:0", NoReader(), torch_module=FakeTorch(cuda))
    assert sampler.sample() == (100, 200) and sampler.device == "cuda:0"


def test_memtracker_on_rank_1_is_quiet_and_writes_the_rank(tmp_path, monkeypatch):
    from gpu_mem_track import MemTracker

    for name, value in env(1).items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    tracker = MemTracker(out_dir=tmp_path, device="cpu", stream=out, probe=False)
    tracker.track("step")
    assert out.getvalue() == ""
    assert tracker.files is not None and tracker.files.folder.name == "rank1"
    assert tracker.files.folder.parent.parent == tmp_path
    with tracker.files.csv.open(newline="") as handle:
        assert {row["rank"] for row in csv.DictReader(handle)} == {"1"}
    loud = io.StringIO()
    MemTracker(out_dir=None, device="cpu", stream=loud, probe=False, verbosity=1).track("x")
    assert "x" in loud.getvalue()


def test_rank_info_round_trips_through_meta(tmp_path):
    result, _ = launch(tmp_path, 1)
    meta = read_meta(result.folder / "meta.json")
    assert RankInfo(meta.rank, meta.local_rank, meta.world_size, "none") == RankInfo(1, 1, 2, "none")
