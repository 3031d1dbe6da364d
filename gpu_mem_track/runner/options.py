"""What a run is asked to do (``RunOptions``, the ``run`` command's options) and what
``run.prepare`` made of it after its checks (``PreparedRun``): the types the checks, the
launcher and the orchestrator share, here so none of them imports the orchestrator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..devices import Device
from ..ranks import RankInfo
from ..runfolder.files import RunFolder
from .history import DEFAULT_ENTRIES

__all__ = ["PreparedRun", "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """What to run and how; see ``python -m gpu_mem_track run --help``.

    ``census_threshold``: bytes; a line execution that grows memory by at least this much
    is followed by a census of live tensors (None: never). ``device``: ``"auto"``,
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. ``engine``: ``"auto"``, ``"monitoring"`` or
    ``"settrace"``. ``top``: lines in the printed summary (0: all). ``memory``: on the
    CPU, ``"rss"`` (the default, ``"auto"``), ``"heap"`` (the C heap in use, see
    ``samplers.HeapSampler``) or ``"tensors"`` (live CPU tensor storages, see
    ``tensorbytes.TensorSampler``); on CUDA only ``"auto"``. ``activations``: record the
    tensors autograd saves for backward while the script runs, so censuses count them as
    activations with the line that saved them (see ``saved.SavedTensorRecorder``).
    ``snapshot``: record the CUDA allocator's history while the script runs, keep it as
    ``snapshot.pickle`` in the run folder and take every line's exact peak from it (see
    ``recording``); ``snapshot_entries``: trace entries it keeps (a ring buffer).
    ``simulate``: run on a simulated GPU of this name (``simgpu.parse_gpu``: a catalog
    name or ``SIZE:smXY``; see ``simulate``); ``max_iterations``, ``max_seconds``: stop
    the script after that many iterations of its loop or wall seconds, and
    ``run_to_end``: do not stop it once its memory is steady (the default under
    ``simulate``); ``end_script``: when a loop is stopped (steady, ``max_iterations``),
    end the script there rather than leave the loop as a ``break`` would; see ``steady``.
    ``levers``: the levers in force for the whole run (``gpu_mem_track.levers``; CUDA
    runs only, real or simulated), in the order given.
    """

    script: str
    args: tuple[str, ...] = ()
    out_dir: str = "reports"
    run_name: str | None = None
    include: tuple[str, ...] = ()
    device: str = "auto"
    census_threshold: int | None = None
    engine: str = "auto"
    top: int = 5
    activations: bool = False
    memory: str = "auto"
    snapshot: bool = False
    snapshot_entries: int = DEFAULT_ENTRIES
    all_ranks: bool = False
    rank_wait: float = 10.0
    simulate: str | None = None
    max_iterations: int | None = None
    max_seconds: float | None = None
    run_to_end: bool = False
    end_script: bool = False
    levers: tuple[str, ...] = ()


@dataclass
class PreparedRun:
    """A checked run: resolved paths, the folder (created), what to trace. In a
    distributed launch ``rank`` says which rank this is and ``folder`` is
    ``<launch>/rank<k>``; ``follow_rank``: the device is decided when the script
    starts CUDA (``ranks.rank_device``), ``device`` is ``cuda:<local rank>`` until then.
    ``device`` is parsed once, here (``checks.resolve_device``): the CPU or a CUDA device
    with its index. ``gpu``: the ``simgpu.GpuSpec`` of ``--simulate`` (None on real
    hardware)."""

    options: RunOptions
    script: Path
    folder: RunFolder
    include_files: frozenset[str]
    include_dirs: tuple[str, ...]
    device: Device
    rank: RankInfo | None = None
    follow_rank: bool = False
    gpu: Any = None
