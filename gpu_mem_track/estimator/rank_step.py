"""One rank's real training step under DDP or FSDP2, measured by storage lifetimes.

For checking the distributed estimator: run inside a process group (``torchrun``, gloo
on the CPU). The same tracking as the single-process check (``trace_cpu_step``): a
:class:`~gpu_mem_track.dispatch.lifetimes.Lifetimes` dispatch mode sees every storage
born and dying, from the model's wrapping on, and the step is ``run_steps``'s. FSDP2
frees and re-allocates its unsharded parameters by resizing their storages in place,
which no dispatch mode sees, so its ``free_storage``/``alloc_storage`` are wrapped
while measuring to tell the tracker. The measured step is the third: DDP rebuilds its
buckets at the start of the second.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..dispatch.lifetimes import Lifetimes
from ..dispatch.memory import ExactMemory
from .options import DistOptions
from .step import InputsLike, as_specs, default_loss, make_inputs, run_steps

__all__ = ["measure_rank_step"]

#: Steps run; the last is measured.
STEPS = 3


def measure_rank_step(
    factory: Callable[[], nn.Module],
    inputs: InputsLike,
    dist_options: DistOptions,
    *,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
) -> dict[str, Any]:
    """This rank's peak live CPU bytes during a training step with Adam (``foreach=False``,
    as on the CPU) under ``dist_options``' strategy; the default process group must exist.
    Returns ``{"peak": bytes, "phases": {phase: bytes}}``."""
    tracker = Lifetimes({"cpu"}, ExactMemory())
    torch.manual_seed(0)
    # Built before tracking (as the single-process check builds it), then adopted: the
    # wrapper's changes (FSDP2 frees the full parameters) are then seen.
    built = factory()
    with tracker, _resizes_told(tracker):
        for tensor in [*built.parameters(), *built.buffers()]:
            tracker.adopt(tensor)
        model = _wrap(built, dist_options)
        del built
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = _optimizer(params, dist_options)
        tensors = make_inputs(as_specs(inputs), "cpu", None)

        def on_phase(phase: str, step: int) -> None:
            tracker.phase = phase
            if phase == "step start" and step == STEPS - 1:
                tracker.start_measuring()

        run_steps(lambda: model(*tensors), params, optimizer, steps=STEPS, loss_fn=loss_fn, on_phase=on_phase)
        return {"peak": tracker.peak, "phases": {k: v[0] for k, v in tracker.phase_peaks.items()}}


def _wrap(model: nn.Module, options: DistOptions) -> nn.Module:
    if options.strategy in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model,
            bucket_cap_mb=options.bucket_cap_mb,
            gradient_as_bucket_view=options.gradient_as_bucket_view,
        )
    if options.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        from .plan import fsdp_units

        for name, unit in fsdp_units(model, options.fsdp_units):
            if name:
                fully_shard(unit, reshard_after_forward=options.reshard_after_forward)
        fully_shard(model, reshard_after_forward=options.reshard_after_forward)
        return model
    raise ValueError(f"no real run for strategy {options.strategy!r}")


def _optimizer(params: list[nn.Parameter], options: DistOptions) -> torch.optim.Optimizer:
    if options.strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, foreach=False)
    return torch.optim.Adam(params, foreach=False)


@contextlib.contextmanager
def _resizes_told(tracker: Lifetimes) -> Iterator[None]:
    """Wrap FSDP2's storage resizes so that ``tracker`` counts them."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    saved = {
        (module, name): getattr(module, name)
        for module in (_fsdp_param, _fsdp_param_group)
        for name in ("alloc_storage", "free_storage")
        if hasattr(module, name)
    }

    def told(original: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
        def resize(tensor: torch.Tensor) -> None:
            original(tensor)
            tracker.resized(tensor)

        return resize

    for (module, name), original in saved.items():
        setattr(module, name, told(original))
    try:
        yield
    finally:
        for (module, name), original in saved.items():
            setattr(module, name, original)
