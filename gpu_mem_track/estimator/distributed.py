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
import fnmatch
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ..errors import UsageError
from .lifetimes import Lifetimes
from .options import DistOptions

__all__ = [
    "Plan",
    "bucket_sizes",
    "estimate_ranks",
    "fsdp_units",
    "make_plan",
    "rank_signature",
    "zero_partition",
]

MIB = 1 << 20
#: torch.distributed._DEFAULT_FIRST_BUCKET_BYTES in torch's source.
FIRST_BUCKET_BYTES = 1 << 20
#: DDP's default bucket_cap_mb.
DEFAULT_BUCKET_CAP_MB = 25


def fsdp_units(module: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs given their own ``fully_shard``, outermost last,
    root (``""``) at the end. Without ``patterns``: every direct child with parameters
    (a ``ModuleList`` or ``ModuleDict``, which has no forward, gives its children);
    with them, every submodule whose name matches one (``fnmatch``)."""
    if patterns:
        units = [(n, m) for n, m in module.named_modules() if n and _matches(n, patterns)]
        if not units:
            raise UsageError(f"no module matches --fsdp-units {', '.join(patterns)}")
        units.sort(key=lambda unit: -unit[0].count("."))  # inner units are sharded first
    else:
        units = _children_with_parameters(module, "")
    return [*units, ("", module)]


def _children_with_parameters(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    units = []
    for name, child in module.named_children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            units += _children_with_parameters(child, f"{prefix}{name}.")
        else:
            units.append((f"{prefix}{name}", child))
    return units


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


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


def zero_partition(numels: list[int], world_size: int) -> list[int]:
    """The owning rank of each parameter (given by element count), as
    ZeroRedundancyOptimizer partitions one parameter group: largest first (stable),
    each to the rank holding the fewest elements so far (the lowest such rank)."""
    owner = [0] * len(numels)
    totals = [0] * world_size
    for index in sorted(range(len(numels)), key=lambda i: -numels[i]):
        rank = totals.index(min(totals))
        owner[index] = rank
        totals[rank] += numels[index]
    return owner


def _shard_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(padded rows, this rank's rows)`` of a dim-0 shard (``torch.chunk``'s split)."""
    padded = math.ceil(rows / world_size)
    return padded, max(0, min(padded, rows - rank * padded))


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
        return tuple(_shard_rows(_rows(params[n]), options.world_size, rank)[1] for n in names)
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


class Plan:
    """One process: changes nothing. Subclasses add the strategy's storages.

    After :meth:`setup`, ``optimized`` lists the parameters the optimizer steps and
    ``stepped`` those whose gradients the step clears; ``roles`` gives the strategy's
    own persistent storages a category (tensor, category) for the breakdown.
    """

    def __init__(
        self,
        options: DistOptions,
        module: nn.Module,
        state: dict[str, torch.Tensor],
        rank: int,
        tracker: Lifetimes,
    ) -> None:
        self.options, self.module, self.state, self.rank, self.tracker = options, module, state, rank, tracker
        self.names = [n for n, t in state.items() if isinstance(t, nn.Parameter) and t.requires_grad]
        self.optimized: list[torch.Tensor] = [state[n] for n in self.names]
        self.stepped: list[torch.Tensor] = list(self.optimized)
        self.roles: list[tuple[torch.Tensor, str]] = []
        self._handles: list[Any] = []

    def setup(self) -> None:
        """Make the strategy's persistent storages (called under the tracker, before
        the optimizer is made)."""

    def on_phase(self, phase: str) -> None:
        """Called as each phase of the step starts."""

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """The strategy's hooks on the module and parameters, for the run."""
        try:
            yield
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def _owned(self) -> list[bool]:
        size = self.options.world_size
        owner = zero_partition([self.state[n].numel() for n in self.names], size)
        return [r == self.rank for r in owner]

    def _owned_in_step_order(self) -> list[torch.Tensor]:
        """This rank's parameters in the order ZeroRedundancyOptimizer gives its local
        optimizer: by size, largest first (the order Adam steps them in)."""
        owned = [self.state[n] for n, mine in zip(self.names, self._owned()) if mine]
        return sorted(owned, key=lambda p: -p.numel())


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


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a module's output that need gradients."""
    return [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
