"""Ranks on simulated GPUs: under ``torchrun`` each rank's process runs its own simulated
GPU (``cuda:LOCAL_RANK`` is that rank's GPU), and the ranks never talk.

:func:`simulate_ranks` makes ``torch.distributed.init_process_group`` start torch's fake
process group (``FakeProcessGroup``, backend ``"fake"`` with a ``FakeStore``) with the
rank and world size torchrun gave, whatever backend, store or ``init_method`` the script
names: collectives complete at once and move no data, as PyTorch's own fake collectives
do. The memory a collective needs is what the code around it allocates, and that is
taken from the rank's simulated allocator as on the GPU: DDP's gradient buckets (made when
the model is wrapped), FSDP2's all-gather and reduce-scatter buffers and its unsharded
parameters (whose storages FSDP2 resizes in place, which no dispatch mode sees, so its
``alloc_storage``/``free_storage`` are wrapped to tell the allocator).

What differs from the GPU, and cannot be helped without the other ranks: the values a
collective would bring (an all-reduced loss, a broadcast flag) stay this rank's own; NCCL's
own buffers (outside the caching allocator) are not counted; DDP runs its buckets through
a hook that returns them unchanged (a script that registers its own communication hook
gets an error from DDP: one hook per model); ``get_device()`` says 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .patches import Patches

if TYPE_CHECKING:
    from .running import RunningGpu

__all__ = ["RankEnv", "simulate_ranks"]


@dataclass(frozen=True)
class RankEnv:
    """This process's place in a torchrun launch: ``rank``, ``world_size``,
    ``local_rank`` (its GPU's index on the host) and ``local_world_size`` (the ranks on
    this host, the GPUs it is given)."""

    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> RankEnv | None:
        """The launch read from torchrun's variables (None outside a launch)."""
        env = os.environ if environ is None else environ
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return None
        world = int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", env["RANK"]))
        return cls(int(env["RANK"]), world, local, int(env.get("LOCAL_WORLD_SIZE", world)))


def simulate_ranks(gpu: RunningGpu, ranks: RankEnv, patches: Patches) -> None:
    """Set up ``gpu`` as rank ``ranks.rank``'s simulated GPU (see the module doc); undone
    with ``patches``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    init = dist.init_process_group

    def fake_init(backend: Any = None, init_method: Any = None, *args: Any, **kwargs: Any) -> Any:
        for name in ("store", "rank", "world_size", "init_method", "device_id"):
            kwargs.pop(name, None)
        store = FakeStore()
        return init("fake", store=store, rank=ranks.rank, world_size=ranks.world_size, **kwargs)

    patches.set(dist, "init_process_group", fake_init)
    patches.set(dist.distributed_c10d, "init_process_group", fake_init)
    count = lambda: ranks.local_world_size  # noqa: E731
    patches.set(torch.cuda, "device_count", count)
    patches.set(torch.accelerator, "device_count", count)
    # this rank's GPU is cuda:LOCAL_RANK: its tensors say so, and it is the current device
    from . import face

    here = torch.device("cuda", ranks.local_rank)
    patches.set(face, "CUDA0", here)
    patches.set(torch.cuda, "current_device", lambda: ranks.local_rank)
    patches.set(torch.accelerator, "current_device_index", lambda: ranks.local_rank)
    patches.set(torch._C, "_get_accelerator", lambda check=False: torch.device("cuda"))
    _ddp_buckets_pass(patches)
    _fsdp_resizes_told(gpu, patches)
    _fsdp_moves_real_tensors(patches)
    _dtensor_metadata_on_meta(patches)


def _passed_on(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP communication hook: the bucket back unchanged, at once (NCCL's all-reduce
    divides it in place: no memory either way). Unannotated: DDP checks a hook's
    annotations, and this module's would be strings."""
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _ddp_buckets_pass(patches: Patches) -> None:
    """DDP's default all-reduce waits on the collective's result, which the fake process
    group leaves empty: the model's buckets go through :func:`_passed_on` instead."""
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def init_passing(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.register_comm_hook(None, _passed_on)

    patches.set(DistributedDataParallel, "__init__", init_passing)


def _fsdp_resizes_told(gpu: RunningGpu, patches: Patches) -> None:
    """FSDP2 frees and re-allocates its unsharded parameters by resizing their storages:
    tell the simulated allocator each time."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    storages = gpu.storages

    def told(original: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
        def resize(tensor: torch.Tensor) -> None:
            original(tensor)
            with torch._C.DisableTorchFunction():
                storages.resized(tensor)

        return resize

    for module in (_fsdp_param, _fsdp_param_group):
        for name in ("alloc_storage", "free_storage"):
            if hasattr(module, name):
                patches.set(module, name, told(getattr(module, name)))


def _fsdp_moves_real_tensors(patches: Patches) -> None:
    """FSDP2's ``fully_shard`` moves a module's parameters and buffers to the mesh's
    device by ``tensor.data = tensor.to(device)`` (``_fsdp_init._move_states_to_device``).
    In the simulation a CPU tensor that stayed real (``virtual``: an integer buffer such
    as BatchNorm's ``num_batches_tracked``, or a tensor made outside a module's
    construction) moves to a meta tensor, and ``set_data`` refuses the pair
    ("incompatible tensor type") where a GPU's CPU and CUDA tensors agree. Such a tensor
    takes its moved copy's implementation instead (``torch._C._swap_tensor_impl``, the
    step of ``torch.utils.swap_tensors`` that keeps the Python object the module, the
    script and FSDP2 hold), before FSDP2's own move, which then finds it moved."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_init
    except ImportError:
        return
    original = getattr(_fsdp_init, "_move_states_to_device", None)
    swap = getattr(torch._C, "_swap_tensor_impl", None)
    if original is None or swap is None:
        return

    def move(params: list[torch.Tensor], buffers: list[torch.Tensor], device: torch.device) -> None:
        for tensor in (*params, *buffers):
            if tensor.device == device or tensor.device.type != "cpu" or type(tensor) not in _PLAIN:
                continue
            with torch.no_grad():
                moved = tensor.to(device)
            if torch._has_compatible_shallow_copy_type(tensor, moved):
                continue
            if type(tensor) is torch.nn.Parameter:
                moved = torch.nn.Parameter(moved, requires_grad=tensor.requires_grad)
            swap(tensor, moved)
        original(params, buffers, device)

    patches.set(_fsdp_init, "_move_states_to_device", move)


#: The tensor classes :func:`_fsdp_moves_real_tensors` moves (subclasses go FSDP2's way).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _dtensor_metadata_on_meta(patches: Patches) -> None:
    """DTensor on a simulated ``cuda`` mesh without CUDA. It derives an op's output
    shape by running it on fake tensors of the mesh's
    device type (``_op_schema._rebuild_tensor_from_dtensor_meta``); a decomposition that
    makes a tensor of its input's device (``uniform_``: ``kaiming_uniform_`` on a sharded
    parameter, as after ``to_empty``) then needs CUDA, which this torch may lack. On a
    ``cuda`` mesh they are made on ``meta`` instead: shapes, strides and dtypes alike."""
    try:
        from torch.distributed.tensor import _op_schema
    except ImportError:
        return
    rebuild = getattr(_op_schema, "_rebuild_tensor_from_dtensor_meta", None)
    if rebuild is None:
        return

    def on_meta(arg: Any) -> object:
        meta = arg.tensor_meta
        if meta is None or arg.mesh.device_type != "cuda":
            return rebuild(arg)
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")

    patches.set(_op_schema, "_rebuild_tensor_from_dtensor_meta", on_meta)
    # DTensor's random ops (``uniform_`` on a sharded parameter) keep a per-mesh RNG
    # tracker whose state is ``torch.cuda.get_rng_state().to("cuda")``: a real CUDA copy.
    # Simulated values are not known anyway: the ops run on the local shard without it.
    from torch.distributed.tensor import _dispatch

    if hasattr(_dispatch, "is_rng_supported_mesh"):
        supported = _dispatch.is_rng_supported_mesh
        patches.set(
            _dispatch,
            "is_rng_supported_mesh",
            lambda mesh: mesh.device_type != "cuda" and supported(mesh),
        )
