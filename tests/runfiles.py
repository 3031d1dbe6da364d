"""Hand-built report files for the compare and plot tests: runner folders written with
``linelog``'s writers and MemTracker CSVs written with ``csvlog``'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpu_mem_track.runfolder.files import TIMELINE_COLUMNS, RunFolder, TimelineWriter, write_lines, write_meta
from gpu_mem_track.runfolder.records import LineRecord, RunInfo
from gpu_mem_track.tracker.csvlog import append_stamp
from gpu_mem_track.tracker.records import Ledger, Stamp

MIB = 2**20


def line(
    code: str,
    number: int,
    increment: int,
    peak: int,
    hits: int = 1,
    function: str = "main",
    exact: bool = True,
) -> LineRecord:
    """A line of /src/train.py (increment and peak in MiB; ``exact`` False: the peak is a lower bound)."""
    return LineRecord(
        file="/src/train.py",
        function=function,
        line=number,
        code=code,
        hits=hits,
        memory=peak * MIB,
        increment=increment * MIB,
        peak=peak * MIB,
        peak_exact=exact,
        seconds=0.01,
    )


def runner_folder(
    root: Path,
    name: str,
    lines: Sequence[LineRecord] = (),
    timeline: Sequence[dict] = (),
    device: str = "cuda:0",
    peak: int | None = None,
) -> Path:
    """Write ``root/name/`` as the runner would: meta.json, lines.csv (when ``lines``),
    timeline.csv (when ``timeline``; dicts of ``TimelineRow`` fields, ``seq`` filled in)."""
    folder = RunFolder(root / name)
    folder.path.mkdir(parents=True)
    source = "cuda allocator" if device.startswith("cuda") else "process RSS"
    info = RunInfo(
        run_name=name,
        script="train.py",
        argv=("train.py",),
        device=device,
        memory_source=source,
        engine="sys.monitoring",
        started=1.0e9,
        python="3.11",
        torch="2.13.0",
        gpu_mem_track="0.1.0",
        ended=1.0e9 + 10,
        exit_code=0,
        peak=peak,
        peak_at="train.py:1",
    )
    write_meta(folder.meta, info)
    if lines:
        write_lines(folder.lines, lines)
    if timeline:
        writer = TimelineWriter(folder.timeline)
        for seq, row in enumerate(timeline):
            values = {"seq": seq, **row}
            writer.write([values.get(column) for column in TIMELINE_COLUMNS])
        writer.close()
    return folder.path


def tracker_csv(path: Path, stamps: Sequence[tuple[str, float, int]], device: str = "cuda:0") -> Path:
    """A MemTracker CSV with one totals row per ``(label, elapsed, bytes)``: on CUDA the
    bytes are allocated (tensors 1 MiB less, reserved 2 MiB more, driver 500 MiB more);
    elsewhere they are the tensor bytes (RSS 100 MiB more)."""
    for seq, (label, elapsed, nbytes) in enumerate(stamps):
        if device.startswith("cuda"):
            ledger = Ledger(
                device=device,
                tensors=nbytes - MIB,
                allocated=nbytes,
                reserved=nbytes + 2 * MIB,
                driver=nbytes + 500 * MIB,
                driver_source="nvml process",
            )
        else:
            ledger = Ledger(device=device, tensors=nbytes, rss=nbytes + 100 * MIB)
        stamp = Stamp(seq, 1.0e9 + elapsed, elapsed, "/src/train.py", 10 + seq, "main", label, ledger)
        append_stamp(path, stamp)
    return path
