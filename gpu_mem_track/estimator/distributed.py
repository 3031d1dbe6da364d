"""What one rank holds under DDP, ZeRO or FSDP2, simulated on meta tensors.

A :class:`Plan` joins the single-process simulation (``simulate._trace``) and adds or
removes storages where the strategy would, at the moment it would; the storage
tracker counts them like any other. Per strategy, on rank ``rank`` of ``world_size``:

- ``ddp``: DistributedDataParallel's gradient buckets, one flat tensor per bucket, alive
  for the whole run (the buckets rebuilt after the first iteration: parameters in
  reverse order, a first bucket of ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``
  (1 MiB) under the default cap, then ``bucket_cap_mb``). Gradients are copied into the
  buckets in place; with ``gradient_as_bucket_view`` each gradient becomes a view of its
  bucket once accumulated (the gradient autograd made is freed).
- ``zero1``: DDP, and the optimizer steps only the parameters this rank owns (its state
  exists for them alone), partitioned as ZeroRedundancyOptimizer does: parameters by
  size, largest first, each to the rank with the fewest elements so far.
- ``zero2``: optimizer state as ``zero1``, and gradients sharded: no buckets; the
  gradient of a parameter another rank owns lives only until it is reduced (freed as
  soon as it is accumulated).
- ``fsdp``: FSDP2 ``fully_shard`` on each unit (see :func:`fsdp_units`) and the root.
  Each parameter is kept as its rank's shard of dim 0, padded to ``ceil(dim0 /
  world_size)`` rows (FSDP2's padding); the optimizer state covers the unpadded shard.
  A unit's forward gathers its parameters (a flat all-gather buffer, then one
  ``padded * world_size`` output per parameter, the flat one then freed); after the
  unit's forward they are freed when ``reshard_after_forward`` (the root never
  reshards after forward). In backward a unit gathers again and prefetches the next
  unit's all-gather buffer; once its gradients are accumulated it frees them into a
  flat reduce-scatter input (kept until the next unit's reduce) and a reduce-scatter
  output of the padded shard size, which holds the sharded gradients as views.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..dispatch.lifetimes import Lifetimes
from .options import DistOptions
from .plan import Plan, shard_rows, zero_partition

__all__ = ["DDPPlan", "Zero2Plan", "bucket_sizes", "estimate_ranks", "make_plan", "rank_signature"]

MIB = 1 << 20
#: torch.distributed._DEFAULT_FIRST_BUCKET_BYTES in torch's source.
FIRST_BUCKET_BYTES = 1 << 20
#: DDP's default bucket_cap_mb.
DEFAULT_BUCKET_CAP_MB = 25


def bucket_sizes(params: list[torch.Tensor], bucket_cap_mb: float | None) -> list[tuple[int, torch.dtype]]:
    """DDP's rebuilt buckets as ``(elements, dtype)``: parameters in reverse order,
    grouped by dtype, a bucket closed once it reaches its cap (the first cap 1 MiB
    under the default 25 MiB, else ``bucket_cap_mb`` for all)."""
    cap = int((bucket_cap_mb or DEFAULT_BUCKET_CAP_MB) * MIB)
    limits = [FIRST_BUCKET_BYTES, cap] if bucket_cap_mb is None else [cap]
    open_: dict[torch.dtype, list[int]] = {}  # dtype -> [elements, bytes, limit index]
    done: list[tuple[int, torch.dtype]] = []
    for param in reversed(params):
        bucket = open_.setdefault(param.dtype, [0, 0, 0])
        bucket[0] += param.numel()
        bucket[1] += param.numel() * param.element_size()
        if bucket[1] >= limits[min(bucket[2], len(limits) - 1)]:
            done.append((bucket[0], param.dtype))
            open_[param.dtype] = [0, 0, bucket[2] + 1]
    done += [(b[0], dtype) for dtype, b in open_.items() if b[0]]
    return done


def rank_signature(
    options: DistOptions, module: nn.Module, params: dict[str, torch.Tensor], rank: int
) -> tuple[Any, ...]:
    """What distinguishes ``rank`` from the others; ranks with equal signatures have
    equal estimates, so only one of them is simulated."""
    names = list(params)
    if options.strategy in ("zero1", "zero2"):
        owner = zero_partition([params[n].numel() for n in names], options.world_size)
        return tuple(n for n, r in zip(names, owner) if r == rank)
    if options.strategy == "fsdp":
        return tuple(shard_rows(_rows(params[n]), options.world_size, rank)[1] for n in names)
    return ()


def estimate_ranks(trace: Callable[[int], Any], model: Any, options: DistOptions) -> Any:
    """The estimate of the rank with the highest peak, ``trace(rank)`` giving one rank's;
    ``ranks`` lists every rank's peak. Ranks with equal :func:`rank_signature` are
    traced once."""
    from dataclasses import replace

    from .records import RankPeak
    from .step import build_model

    module = model if isinstance(model, nn.Module) else build_model(model, "meta")
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    first: dict[tuple[Any, ...], int] = {}
    group = [
        first.setdefault(rank_signature(options, module, params, r), r) for r in range(options.world_size)
    ]
    traced = {rank: trace(rank) for rank in sorted(set(group))}
    ranks = tuple(RankPeak(r, traced[g].peak, traced[g].peak_phase.phase) for r, g in enumerate(group))
    worst = max(traced.values(), key=lambda e: e.peak)
    return replace(worst, ranks=ranks)


def _rows(tensor: torch.Tensor) -> int:
    return tensor.shape[0] if tensor.dim() else 1


def make_plan(
    options: DistOptions, module: nn.Module, state: dict[str, torch.Tensor], rank: int, tracker: Lifetimes
) -> Plan:
    """The plan of ``options.strategy`` for ``rank``; ``state`` maps parameter and buffer
    names to the tensors the step runs with (the plan may replace parameters)."""
    kinds = {"none": Plan, "ddp": DDPPlan, "zero1": DDPPlan, "zero2": Zero2Plan}
    if options.strategy == "fsdp":
        from .fsdp import FSDPPlan

        return FSDPPlan(options, module, state, rank, tracker)
    return kinds[options.strategy](options, module, state, rank, tracker)


class DDPPlan(Plan):
    """``ddp`` and ``zero1`` (see the module doc)."""

    def setup(self) -> None:
        params = [self.state[n] for n in self.names]
        self.buckets: list[torch.Tensor] = []
        for numel, dtype in bucket_sizes(params, self.options.bucket_cap_mb):
            bucket = torch.empty(numel, dtype=dtype, device=params[0].device)
            self.tracker.adopt(bucket)
            self.buckets.append(bucket)
            self.roles.append((bucket, "gradient"))
        self.views = self._views(params)
        if self.options.strategy == "zero1":
            self.optimized = self._owned_in_step_order()

    def _views(self, params: list[torch.Tensor]) -> dict[int, torch.Tensor]:
        """Each parameter's view of its bucket, by ``id``."""
        views: dict[int, torch.Tensor] = {}
        offsets: dict[torch.dtype, tuple[int, int]] = {}  # dtype -> (bucket index, offset)
        per_dtype = {
            dt: [i for i, b in enumerate(self.buckets) if b.dtype == dt] for dt in {p.dtype for p in params}
        }
        for param in reversed(params):
            index, offset = offsets.get(param.dtype, (0, 0))
            bucket = self.buckets[per_dtype[param.dtype][index]]
            views[id(param)] = bucket[offset : offset + param.numel()].view_as(param)
            offset += param.numel()
            offsets[param.dtype] = (index + 1, 0) if offset == bucket.numel() else (index, offset)
        return views

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        if self.options.gradient_as_bucket_view:
            for name in self.names:
                param = self.state[name]
                view = self.views[id(param)]
                self._handles.append(param.register_post_accumulate_grad_hook(_set_grad(view)))
        with super().hooks():
            yield


def _set_grad(value: torch.Tensor | None) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        param.grad = value

    return hook


class Zero2Plan(Plan):
    """``zero2`` (see the module doc)."""

    def setup(self) -> None:
        self.mine = self._owned()
        self.optimized = self._owned_in_step_order()

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        for name, mine in zip(self.names, self.mine):
            if not mine:
                self._handles.append(self.state[name].register_post_accumulate_grad_hook(_set_grad(None)))
        with super().hooks():
            yield
