"""A run folder's data model: per-line aggregates, timeline rows and the run's description.

Plain frozen records and pure functions over them; nothing here measures or prints.
Producers (the runner's ``profiler``, ``snapshots.folder``, the notebook) make them,
``files`` saves them, ``read`` loads them back, ``render`` renders them.
All sizes are bytes of the run's *memory source* (``RunInfo.memory_source``): the
caching allocator's allocated bytes on CUDA, the process's resident set size on the CPU.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

__all__ = [
    "EVENTS",
    "HEAP_SOURCE",
    "TENSORS_SOURCE",
    "LineRecord",
    "RunInfo",
    "SimulationInfo",
    "SnapshotMerge",
    "StopInfo",
    "TimelineRow",
    "by_function",
    "hottest",
]

#: Timeline events: the run's start and end, one execution of a traced line, a
#: ``MemTracker.track()`` stamp (with its label), an automatic census after a line.
EVENTS = ("start", "line", "track", "census", "end")

#: ``RunInfo.memory_source`` of the runner's C-heap sampler (``runner.samplers.HeapSampler``).
HEAP_SOURCE = "C heap in use"
#: ``RunInfo.memory_source`` of ``--memory tensors`` (``runner.tensorbytes.TensorSampler``).
TENSORS_SOURCE = "CPU tensor storages"


@dataclass(frozen=True)
class LineRecord:
    """One source line over the whole run.

    ``memory`` is the memory after its last execution; ``increment`` the sum over all
    executions of (memory after - memory before), so a loop that frees what it allocates
    sums to about 0; ``peak`` the highest memory seen while it ran, over all executions
    (see ``profiler`` for how peaks are found without resetting the program's counters);
    ``peak_exact`` whether that peak was read from a high-water mark the line raised
    (True) or is the larger of the before/after readings, a lower bound (False);
    ``seconds`` the wall time spent in it, callees included; ``rise`` the most one
    execution raised memory above its own start (its peak minus the memory when it
    started, the largest over its executions): what the line allocated even when it also
    freed more, so its net ``increment`` is negative. None in files written before it was
    recorded. ``hits`` counts executions of the statement that starts on ``line``
    (a call spread over several lines counts once). ``rank``: the rank of the
    distributed launch that ran it (None outside one, and in files written before ranks).
    ``reserved_peak``: on CUDA, the caching allocator's reserved bytes at their highest
    while the line ran (read as ``peak`` is, from the allocator's reserved peak; None on
    the CPU and in files written before it was recorded).
    """

    file: str
    function: str
    line: int
    code: str
    hits: int
    memory: int
    increment: int
    peak: int
    peak_exact: bool
    seconds: float
    rise: int | None = None
    rank: int | None = None
    reserved_peak: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LineRecord:
        """The record of ``to_dict``'s mapping; ``rise``, ``rank`` and ``reserved_peak``
        may be missing (older files)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data or f.default is MISSING})

    @property
    def growth(self) -> int:
        """What ranks the line among those that grew memory: ``rise`` where recorded,
        else (older files) the net ``increment``."""
        return self.rise if self.rise is not None else self.increment


@dataclass(frozen=True)
class TimelineRow:
    """One event of the run, in order (``seq`` from 0).

    ``elapsed``: seconds since the run started, at the end of the event. ``memory``,
    ``increment`` and ``peak``: as in ``LineRecord``, for this one execution.
    ``allocated`` and ``reserved``: the CUDA caching allocator (None on the CPU);
    ``driver``: the driver's figure for the process where it was read (it is sampled, not
    read at every line); ``rss``: the process's resident set size where read; ``rank``:
    the rank of the distributed launch (None outside one).
    """

    seq: int
    elapsed: float
    event: str
    file: str = ""
    function: str = ""
    line: int | None = None
    label: str = ""
    memory: int | None = None
    increment: int | None = None
    peak: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    driver: int | None = None
    rss: int | None = None
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimelineRow:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class StopInfo:
    """Where and why the runner stopped a loop, or the script, early (``runner.steady``).

    ``reason``: ``"steady"``, ``"max-iterations"`` or ``"max-seconds"``; ``file``/``line``:
    where it was stopped (the watched loop's header, or the line that was starting when
    the time ran out); ``iterations``: iterations of the watched loop completed (0 when
    none was found); ``seconds``: wall time since the script started; ``loop``:
    ``file:line`` of the watched loop's header ("" when none); ``warmup`` and ``steady``:
    the rule's iterations (``steady.StopRule``).

    ``action``: ``"left-loop"`` (the loop was left as a ``break`` would, and the script
    went on at ``resumed``, ``file:line``; with ``resumed_after``, the loop ended its
    function or block and the script went on from the end of it, after that line) or
    ``"ended-script"`` (the script was ended there; run descriptions written before
    loops were left say nothing, and mean this);
    ``skipped``: iterations of the loop that were skipped (None when that cannot be known:
    a ``while`` loop, a generator); ``left``: ``file:line`` of the other loops left
    afterwards, each once (the loops around it, at their header; inner and evaluation loops
    left alone, later loops once steady);
    ``note``: why the script was ended rather than the loop left, or ended after it;
    ``ended_at``: ``file:line`` where the script was ended after the loop was left ("" when
    it ran to its end); ``repeats``: each loop left more than once (entered again and steady
    again: an evaluation called every few hundred steps, the micro-steps of each optimizer
    step), as ``"file:line N times, M iteration(s) skipped in all"`` (or "how many skipped
    not known").
    """

    reason: str
    file: str
    line: int
    iterations: int
    seconds: float
    loop: str = ""
    warmup: int = 2
    steady: int = 2
    action: str = "ended-script"
    skipped: int | None = None
    resumed: str = ""
    left: tuple[str, ...] = ()
    note: str = ""
    ended_at: str = ""
    resumed_after: bool = False
    repeats: tuple[str, ...] = ()

    def describe(self) -> str:
        """One or two sentences: what was stopped, why, and where the script went on."""
        if self.reason == "steady":
            why = (
                f"memory steady (no new peak, allocated or reserved, and no new line for "
                f"{self.steady} iterations after {self.warmup} of warm-up)"
            )
        elif self.reason == "max-iterations":
            why = "--max-iterations reached"
        else:
            why = "--max-seconds reached"
        if self.action != "left-loop":
            loop = f" of the loop at {self.loop}" if self.loop else ""
            text = f"stopped at {self.file}:{self.line} after {self.iterations} iteration(s){loop}"
            text += f", {self.seconds:.1f} s: {why}"
            return f"{text} ({self.note})" if self.note else text
        skipped = (
            f"{self.skipped:,} iteration(s) skipped"
            if self.skipped is not None
            else "its remaining iterations skipped (how many is not known)"
        )
        text = (
            f"left the loop at {self.loop} after {self.iterations} iteration(s), {self.seconds:.1f} s: "
            f"{why}; {skipped}, the script went on {'after' if self.resumed_after else 'at'} {self.resumed}"
        )
        if self.resumed_after:
            text += " (the end of its function or block)"
        if self.left:
            text += f"; also left the loop(s) at {', '.join(self.left)}"
        if self.repeats:
            text += f"; loops left more than once (each time steady again): {'; '.join(self.repeats)}"
        if self.ended_at:
            text += f"; the script was ended at {self.ended_at}: {self.note}"
        return text

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["left"] = list(self.left)
        data["repeats"] = list(self.repeats)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StopInfo:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["left"] = tuple(values.get("left", ()))
        values["repeats"] = tuple(values.get("repeats", ()))
        return cls(**values)


@dataclass(frozen=True)
class SimulationInfo:
    """How a ``run --simulate`` went on its simulated GPU (``gpu_mem_track.simgpu``).

    ``gpu``: the GPU's description (``simgpu.GpuSpec.to_dict()``: ``name``,
    ``total_memory``, ``context_bytes`` and ``library_bytes`` (the non-PyTorch memory:
    CUDA context, cuBLAS/cuDNN handles) in bytes, ``capability``, ``cublas_workspace``
    bytes, where the figures come from: ``source``, ``context_source``); ``placeholders``:
    value reads that got a placeholder (``simgpu.Placeholder.to_dict()``: ``filename``, ``line``, ``op``,
    ``count``); ``bounds``: data-dependent shapes taken at their upper bound
    (``simgpu.Bound.to_dict()``: ``filename``, ``line``, ``op``, ``bound``, ``count``);
    ``skipped_saves``: ``torch.save`` calls of simulated tensors that wrote nothing;
    ``compiled``: the torch.compile regions, which the simulation ran as eager code
    (``simgpu.Compiled.to_dict()``: ``filename``, ``line``, ``api``, ``backend``,
    ``mode``, ``count``; empty without torch.compile and in files written before it was
    recorded; ``simtext.compiled_note`` says it in one line); ``out_of_memory``: where
    the GPU ran out (``simgpu.OutOfMemory.to_dict()``: ``filename``, ``line``,
    ``request``, ``allocated``, ``reserved``, ``capacity`` bytes, ``message``), None when
    it did not.
    """

    gpu: dict[str, Any]
    placeholders: tuple[dict[str, Any], ...] = ()
    bounds: tuple[dict[str, Any], ...] = ()
    skipped_saves: int = 0
    out_of_memory: dict[str, Any] | None = None
    compiled: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["placeholders"], data["bounds"] = list(self.placeholders), list(self.bounds)
        data["compiled"] = list(self.compiled)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimulationInfo:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["placeholders"] = tuple(values.get("placeholders", ()))
        values["bounds"] = tuple(values.get("bounds", ()))
        values["compiled"] = tuple(values.get("compiled", ()))
        return cls(**values)


@dataclass(frozen=True)
class RunInfo:
    """What was run, where, and how it ended.

    ``memory_source``: ``"cuda allocator"`` or ``"process RSS"``; ``engine``:
    ``"sys.monitoring"`` or ``"sys.settrace"``; ``started``/``ended``: seconds since the
    epoch (``ended`` None while running); ``exit_code``: the script's (130 after Ctrl-C,
    1 after an uncaught exception, 128 + N after signal N), None while running; ``peak``:
    the highest memory read during the run (bytes), in a line or not (the timeline's
    ``start`` and ``end`` rows included), so it is the highest figure ``timeline.csv``
    holds; ``peak_at``: ``file:line`` of the line that raised memory to it (see
    ``profiler``), empty when no line came near it; ``peak_phase``: the label of the last
    ``MemTracker.track()`` stamp before the peak ("" if none came before it);
    ``end_memory``: the memory when the script ended (bytes).

    In a distributed launch (``ranks.RankInfo``; all None outside one): ``rank``,
    ``local_rank``, ``world_size``; ``launch``: the launch folder's name (the run folder
    is ``<launch>/rank<k>``); ``device`` is the device this rank measured.

    ``reserved_peak``: the CUDA allocator's reserved-bytes peak when the script ended
    (None on the CPU, and in files written before it was recorded); ``simulation``: how
    a ``run --simulate`` went on its simulated GPU (None on real hardware);
    ``stopped``: where and why the runner stopped the script early (None when it ran to
    its end); ``levers``: what each ``run --lever`` did, in the order given
    (``levers.LeverReport.to_dict()``: ``name``, ``applied``, ``reason``, ``detail``,
    ``change``, ``where``, ``cost``, ``changes_results``, ``reached``; empty without levers and in
    files written before them).

    How the lines were read (all "" in files written before they were recorded):
    ``line_sink``: ``"native"`` (the C++ line sink, ``native/line_sink.cpp``) or
    ``"python"``, chosen when the run started; ``line_sink_note``: why
    (``native.linesink.status()``: loaded from where, off, being built in the background,
    not built and why); ``stats_reader``: on a real GPU, how the CUDA allocator's
    statistics were read when the run ended, ``"native"`` (``native/cuda_stats.cpp``) or
    ``"dict"`` (``torch._C._cuda_memoryStats``); "" on the CPU and a simulated GPU.
    """

    run_name: str
    script: str
    argv: tuple[str, ...]
    device: str
    memory_source: str
    engine: str
    started: float
    python: str
    torch: str
    gpu_mem_track: str
    ended: float | None = None
    exit_code: int | None = None
    peak: int | None = None
    peak_at: str = ""
    peak_phase: str = ""
    end_memory: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    launch: str = ""
    reserved_peak: int | None = None
    simulation: SimulationInfo | None = None
    stopped: StopInfo | None = None
    levers: tuple[dict[str, Any], ...] = ()
    line_sink: str = ""
    line_sink_note: str = ""
    stats_reader: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["levers"] = list(self.levers)
        if self.simulation is not None:
            data["simulation"] = self.simulation.to_dict()
        return {"format": "gpu_mem_track run", "version": 1, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunInfo:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["argv"] = tuple(values.get("argv", ()))
        values["levers"] = tuple(values.get("levers") or ())
        if values.get("simulation") is not None:
            values["simulation"] = SimulationInfo.from_dict(values["simulation"])
        if values.get("stopped") is not None:
            values["stopped"] = StopInfo.from_dict(values["stopped"])
        return cls(**values)


@dataclass(frozen=True)
class SnapshotMerge:
    """How ``run --snapshot`` used the memory snapshot it recorded (``file``, in the run
    folder; "" when none was written) for the line records.

    ``device``: the CUDA device index analysed; ``entries``: its trace entries;
    ``counted``: allocations and frees the allocator counted while recording;
    ``traced``: those still in the trace (the ring buffer keeps the last
    ``--snapshot-entries`` entries); ``lines``: line records; ``exact``: lines whose peak
    is exact; ``raised``: lines whose peak the trace raised above the runner's readings;
    ``outside``: line executions with allocations or frees that fell out of the trace
    (their lines keep the runner's peak); ``placed``: trace entries without a Python
    stack given the line that was running; ``note``: why the trace was not merged (""
    when it was).
    """

    file: str
    device: int = 0
    entries: int = 0
    counted: int = 0
    traced: int = 0
    lines: int = 0
    exact: int = 0
    raised: int = 0
    outside: int = 0
    placed: int = 0
    note: str = ""

    @property
    def merged(self) -> bool:
        return bool(self.file) and not self.note

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SnapshotMerge:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def hottest(records: list[LineRecord], count: int = 10) -> list[LineRecord]:
    """The ``count`` lines (0: all) that raised memory most, by ``LineRecord.growth``,
    largest first (ties: the larger net increment, the higher peak, then file order);
    lines that never raised it are left out."""
    ranked = sorted(records, key=lambda r: (-r.growth, -r.increment, -r.peak, r.file, r.line))
    best = [r for r in ranked if r.growth > 0]
    return best[:count] if count else best


def by_function(records: list[LineRecord]) -> dict[tuple[str, str], list[LineRecord]]:
    """Records grouped by (file, function), each group in line order, groups in order of
    their first line."""
    groups: dict[tuple[str, str], list[LineRecord]] = {}
    for record in sorted(records, key=lambda r: (r.file, r.line)):
        groups.setdefault((record.file, record.function), []).append(record)
    return groups
