"""Which rank of a distributed launch this process is, and where its reports go.

``torchrun`` (``python -m torch.distributed.run``) starts one process per rank and tells
each which one it is through environment variables: ``RANK`` (0 .. world size - 1),
``LOCAL_RANK`` (the rank on this node, the usual CUDA device index), ``WORLD_SIZE`` and
``TORCHELASTIC_RUN_ID``. :func:`rank_info` reads them; it returns None outside a
distributed launch, and everything then behaves as for one process.

All ranks of one launch write into one *launch folder*, ``<out_dir>/<launch>/rank<k>/``,
without talking to each other: every rank computes the same ``<launch>`` name from what
it shares with the others (see :func:`launch_name`):

1. ``--run-name`` (or ``MemTracker(run_name=...)``) when given: the name is the user's.
2. else a real rendezvous id (``TORCHELASTIC_RUN_ID``, set by ``torchrun --rdzv-id``, by
   ``--standalone``, and by torch 2.13's torchrun on one node without ``--rdzv-endpoint``
   or ``--master-port``; its default otherwise, ``"none"``, says nothing):
   ``<script>-<run id>`` (a UUID is cut to its first 8 hex digits).
3. else the launcher process, the parent of every local rank (torchrun's agent): its pid
   and its start time, read from ``/proc/<ppid>/stat`` on Linux:
   ``<script>-<YYYYmmdd-HHMMSS of the agent's start>-p<agent pid>``. A pid and a start
   time name one process on a host, so the name is the same for every rank of a launch
   and differs between launches.
4. else (no ``/proc``): ``<script>-p<agent pid>-<MASTER_PORT>``, which a later launch may
   repeat; the claim rule below then moves it on.

The claim rule: a rank takes ``<launch>/rank<k>/`` by creating it; when it already exists
(an earlier launch of the same name), the rank tries ``<launch>-2``, ``-3``, ... A launch
whose ranks all find the same earlier folders full moves on together. On several nodes
without a shared rendezvous id each node's ranks compute their own agent's name: pass
``--run-name`` (or ``torchrun --rdzv-id``) for one folder across nodes on a shared disk.

Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .errors import UsageError
from .outputs import claim_folder, safe_name

__all__ = [
    "RankInfo",
    "agent_start",
    "is_launch_folder",
    "launch_name",
    "rank_folder",
    "rank_folders",
    "rank_device",
    "rank_info",
]

_RANK_DIR = re.compile(r"rank(\d+)")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@dataclass(frozen=True)
class RankInfo:
    """One process's place in a distributed launch.

    ``rank``: global rank, 0 .. ``world_size`` - 1; ``local_rank``: rank on this node
    (the CUDA device index by convention); ``world_size``: number of ranks of the launch;
    ``run_id``: the launcher's ``TORCHELASTIC_RUN_ID`` ("" when unset, ``"none"`` is
    torchrun's value without a rendezvous id).
    """

    rank: int
    local_rank: int
    world_size: int
    run_id: str = ""

    @property
    def folder_name(self) -> str:
        """``rank<k>``: this rank's folder inside the launch folder."""
        return f"rank{self.rank}"

    @property
    def is_first(self) -> bool:
        """Whether this is rank 0, the one that prints."""
        return self.rank == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankInfo:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """This process's rank from the launcher's environment (``os.environ`` unless
    ``environ`` is given), or None when ``RANK`` or ``WORLD_SIZE`` is unset (not a
    distributed launch). ``LOCAL_RANK`` defaults to ``RANK``. Raises ``UsageError`` for
    values that are not whole numbers or a rank outside the world size."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank = int(env["RANK"])
        world = int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        names = "RANK, LOCAL_RANK and WORLD_SIZE"
        raise UsageError(f"{names} must be whole numbers, not {_shown(env)}") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise UsageError(f"RANK={rank} does not fit WORLD_SIZE={world} (LOCAL_RANK={local})")
    return RankInfo(rank, local, world, env.get("TORCHELASTIC_RUN_ID", ""))


def _shown(env: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={env.get(k)!r}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def rank_device(cuda: Any, local_rank: int) -> int:
    """The CUDA device a rank uses, asked once the program has started CUDA: the current
    device when the program chose one (``torch.cuda.set_device(local_rank)``), else
    ``local_rank`` (a program that puts its tensors on ``cuda:<local_rank>`` without
    ``set_device``), else 0 when the rank sees fewer devices (``CUDA_VISIBLE_DEVICES``
    narrowed to one per rank). ``cuda``: ``torch.cuda``."""
    current = int(cuda.current_device())
    if current != 0:
        return current
    return local_rank if local_rank < int(cuda.device_count()) else current


def agent_start(ppid: int, proc: Path = Path("/proc")) -> float | None:
    """When process ``ppid`` started, in seconds since the epoch, from
    ``<proc>/<ppid>/stat`` (field 22, clock ticks after boot) and ``<proc>/stat``
    (``btime``); None where they cannot be read (not Linux, the process is gone)."""
    try:
        stat = (proc / str(ppid) / "stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in (proc / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        ticks = int(stat.rpartition(")")[2].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def launch_name(
    script: str | Path,
    run_name: str | None,
    info: RankInfo,
    environ: Mapping[str, str] | None = None,
    ppid: int | None = None,
    proc: Path = Path("/proc"),
) -> str:
    """The launch folder's name, the same on every rank of one launch and different
    across launches (the rule is in this module's docstring). ``script``: the script
    (its stem starts the name); ``ppid``: the launcher's pid (default: our parent's)."""
    if run_name:
        return safe_name(run_name)
    env = os.environ if environ is None else environ
    stem = Path(script).stem or "python"
    run_id = info.run_id
    if run_id and run_id != "none":
        return safe_name(f"{stem}-{run_id[:8] if _UUID.fullmatch(run_id) else run_id}")
    parent = os.getppid() if ppid is None else ppid
    started = agent_start(parent, proc)
    if started is not None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
        return safe_name(f"{stem}-{stamp}-p{parent}")
    return safe_name(f"{stem}-p{parent}-{env.get('MASTER_PORT', '0')}")


def rank_folder(
    out_dir: str | Path,
    run_name: str | None,
    script: str | Path,
    info: RankInfo,
    environ: Mapping[str, str] | None = None,
    ppid: int | None = None,
    proc: Path = Path("/proc"),
) -> Path:
    """Create and return ``<out_dir>/<launch>/rank<k>/`` for this rank: the first of
    ``<launch>``, ``<launch>-2``, ... whose ``rank<k>`` no earlier launch took (and which
    is not a one-process run folder). Raises ``UsageError`` when ``out_dir`` cannot be
    written."""
    out = Path(out_dir)
    base = launch_name(script, run_name, info, environ, ppid, proc)

    def one_process_run(launch: Path) -> bool:
        return (launch / "meta.json").exists()

    return claim_folder(out, base, inner=info.folder_name, skip=one_process_run)


def rank_folders(launch: str | Path) -> dict[int, Path]:
    """The ``rank<k>`` folders of a launch folder, by rank (empty for any other folder)."""
    found = {}
    path = Path(launch)
    if path.is_dir():
        for child in path.iterdir():
            match = _RANK_DIR.fullmatch(child.name)
            if match and child.is_dir():
                found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def is_launch_folder(path: str | Path) -> bool:
    """Whether ``path`` is a launch folder: it holds at least one ``rank<k>`` folder."""
    return bool(rank_folders(path))
