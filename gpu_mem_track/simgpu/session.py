"""``simulated_gpu``: run code as if ``cuda:0`` were a named GPU, on a machine without one.

Entering a :class:`SimulatedGpu` builds the caching-allocator model with the GPU's
capacity (``total_memory - context_bytes``), pushes two dispatch modes (the values of
small known tensors, :class:`~gpu_mem_track.dispatch.values.KnownValues`, under the
storage tracker, :class:`~gpu_mem_track.simgpu.engine.Storages`) and the torch-function
face (:class:`~gpu_mem_track.simgpu.face.CudaFace`), and replaces the ``torch.cuda``
API (:mod:`~gpu_mem_track.simgpu.cudaapi`). Exiting undoes all of it, also after an
exception, and puts back the default device (``torch.set_default_device``) the session
began with; simulated tensors still alive afterwards are plain meta tensors.

The modes are per thread: code run on other threads (the DataLoader's pin-memory
thread aside, which only pins) does not see the simulation. DataLoader worker
processes fork with it and run real CPU code as before.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from ..dispatch.memory import alloc_settings
from ..dispatch.values import KnownValues
from ..gpumodel.workspace import CublasWorkspace, workspace_bytes
from .catalog import GpuSpec, parse_gpu
from .compiled import CompileWatch
from .cudaapi import install
from .engine import GpuMemory, Storages, user_line
from .face import CudaFace, checkpoint_metadata
from .patches import Patches
from .ranks import RankEnv, simulate_ranks
from .records import Bound, Compiled, OutOfMemory, Placeholder
from .usermeta import MetaTensors
from .virtual import VirtualCpu, default_device

__all__ = ["SimulatedGpu", "simulated_gpu"]


class SimulatedGpu:
    """One simulated GPU session (a context manager; see the module doc and
    :func:`simulated_gpu`). ``spec``: the GPU; ``allocator``: the caching-allocator model
    (``allocated``, ``reserved``, ``stats``); ``placeholders``, ``bounds``,
    ``out_of_memory`` (the latest, or None), ``skipped_saves`` and ``compiled`` (the
    torch.compile regions, run as eager code: :mod:`~gpu_mem_track.simgpu.compiled`)
    tell what the simulation could not do as the GPU would."""

    def __init__(
        self, spec: GpuSpec | str, alloc_conf: str | None = None, ranks: RankEnv | None = None
    ) -> None:
        self.spec = parse_gpu(spec)
        self.ranks = ranks
        self.memory = GpuMemory(self.spec, alloc_settings(alloc_conf), on_oom=self._note_oom)
        self.allocator = self.memory.allocator
        config = None if "CUBLAS_WORKSPACE_CONFIG" in _environ() else ""
        workspace = self.spec.cublas_workspace if config == "" else workspace_bytes(None, config)
        self.virtual = VirtualCpu()
        self.meta = MetaTensors()
        self.storages = Storages(self.memory, CublasWorkspace(workspace, {}), self.virtual, self.meta)
        self.values = KnownValues(on_read=self._note_read, on_bound=self._note_bound)
        self.face = CudaFace(self.virtual, self.values.assume, self.meta)
        self.face.capability = self.spec.capability
        self.out_of_memory: OutOfMemory | None = None
        self.skipped_saves = 0
        self._compiles = CompileWatch()
        self._placeholders: Counter[tuple[str, int, str]] = Counter()
        self._bounds: dict[tuple[str, int, str], tuple[int, int]] = {}
        self._stack: ExitStack | None = None

    @property
    def placeholders(self) -> list[Placeholder]:
        """Value reads that got a placeholder, per (file, line, op), in first-seen order."""
        return [Placeholder(f, line, op, n) for (f, line, op), n in self._placeholders.items()]

    @property
    def compiled(self) -> list[Compiled]:
        """torch.compile regions per call site, in first-seen order; each ran as eager code."""
        return self._compiles.regions

    @property
    def bounds(self) -> list[Bound]:
        """Data-dependent shapes given an upper bound, per (file, line, op): the largest
        bound taken there and how often."""
        return [Bound(f, line, op, bound, n) for (f, line, op), (bound, n) in self._bounds.items()]

    def __enter__(self) -> SimulatedGpu:
        if self._stack is not None:
            raise RuntimeError("this simulated GPU is already running")
        stack = ExitStack()
        try:
            patches = Patches()
            stack.callback(patches.restore)
            install(self, patches)
            self._compiles.install(patches)
            self._autocast_cache(patches)
            if self.ranks is not None:
                simulate_ranks(self, self.ranks, patches)
            stack.enter_context(self.values)
            stack.enter_context(self.storages)
            stack.callback(self.storages.close)
            stack.enter_context(checkpoint_metadata())
            stack.enter_context(self.face)
            stack.callback(_restore_default_device, default_device())
            stack.callback(_forget_fsdp_classes, set(_fsdp_classes()))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def note_skipped_save(self) -> None:
        """A ``torch.save`` of simulated tensors wrote nothing; said once on stderr."""
        if not self.skipped_saves:
            print("gpu_mem_track: torch.save of simulated GPU tensors writes nothing", file=sys.stderr)
        self.skipped_saves += 1

    def _autocast_cache(self, patches: Patches) -> None:
        """Autocast clears its weight cache when the outermost region exits: ours too."""
        clear = torch.clear_autocast_cache
        casts = self.face.autocast

        def clear_both() -> None:
            casts.clear()
            clear()

        patches.set(torch, "clear_autocast_cache", clear_both)

    def _note_read(self, op: str, placeholder: str) -> None:
        if placeholder:
            filename, line = user_line()
            self._placeholders[(filename, line, op)] += 1

    def _note_bound(self, op: str, bound: int) -> None:
        filename, line = user_line()
        old, n = self._bounds.get((filename, line, op), (0, 0))
        self._bounds[(filename, line, op)] = (max(old, bound), n + 1)

    def _note_oom(self, record: OutOfMemory) -> None:
        self.out_of_memory = record


def _restore_default_device(device: Any) -> None:
    """Put back the default device the session began with (a ``torch.set_default_device
    ("cuda")`` made inside must not outlive the simulated GPU)."""
    if default_device() != device:
        torch.set_default_device(device)


_FSDP = "torch.distributed.fsdp._fully_shard._fully_shard"


def _fsdp_classes() -> dict[type, type]:
    """FSDP2's cache of the classes ``fully_shard`` made (``cls_to_fsdp_cls``: a model's
    class to its ``FSDP<name>`` subclass), empty when FSDP2 is not imported."""
    module = sys.modules.get(_FSDP)
    return getattr(module, "cls_to_fsdp_cls", {}) if module is not None else {}


def _forget_fsdp_classes(before: set[type]) -> None:
    """Drop what ``fully_shard`` cached while the session ran: the cache keeps a script's
    model classes, and through their methods' globals the script's whole namespace (its
    model and optimizer), alive for the rest of the process."""
    cache = _fsdp_classes()
    for cls in [c for c in cache if c not in before]:
        del cache[cls]


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


@contextmanager
def simulated_gpu(
    spec: GpuSpec | str, *, alloc_conf: str | None = None, ranks: RankEnv | None = None
) -> Iterator[SimulatedGpu]:
    """Run the block as if ``cuda:0`` were the GPU ``spec`` (a ``GpuSpec``, a catalog name
    such as ``"a100-40gb"``, or ``"24GiB:sm86"``); ``alloc_conf`` is a
    ``PYTORCH_CUDA_ALLOC_CONF`` value (None: the environment variable); ``ranks`` (a
    :class:`~gpu_mem_track.simgpu.ranks.RankEnv`) makes it one rank's GPU of a torchrun
    launch, its process group a fake one (:mod:`~gpu_mem_track.simgpu.ranks`). Yields the
    :class:`SimulatedGpu`. Unknown names and bad settings raise ``UsageError``."""
    with SimulatedGpu(spec, alloc_conf, ranks) as gpu:
        yield gpu
