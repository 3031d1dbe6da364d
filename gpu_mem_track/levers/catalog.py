"""The levers: their names, cheapest first, and what each costs in words.

A lever is a change to a training script that can lower its GPU memory, applied by
``run --lever NAME`` without editing the script (``apply.applied_levers``). This module
is the one place that names them; it imports no torch.

The order of ``LEVERS`` is the ranking by cost (cheapest first): the allocator's
expandable segments cost nothing, gradients set to None and the optimizer's
implementation cost nothing or little, the optimizer's garbage-collection threshold
costs allocator time, mixed precision changes the numbers, checkpointing costs compute.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import UsageError

__all__ = ["LEVERS", "SHARDING_LEVERS", "LeverInfo", "check_levers", "describe"]


@dataclass(frozen=True)
class LeverInfo:
    """What a lever is, before it is tried on a script.

    ``name``: as ``--lever`` takes it; ``rank``: its place by cost, 0 the cheapest;
    ``cost``: the price in words; ``changes_results``: whether the script's numbers
    change (lower precision); ``summary``: what the lever does, one sentence;
    ``change``: the generic change to make in a script (each run's report gives the
    one for its script, at the place found)."""

    name: str
    rank: int
    cost: str
    changes_results: bool
    summary: str
    change: str


_INFOS = (
    LeverInfo(
        "expandable",
        0,
        "none",
        False,
        "the caching allocator's expandable segments (PYTORCH_CUDA_ALLOC_CONF), merged into the user's",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    ),
    LeverInfo(
        "grads-to-none",
        1,
        "none",
        False,
        "zero_grad() of optimizers and modules always sets gradients to None",
        "optimizer.zero_grad(set_to_none=True)",
    ),
    LeverInfo(
        "no-foreach",
        2,
        "a slower optimizer step (one kernel per parameter instead of batched kernels)",
        False,
        "optimizers built with foreach=False (no batched per-step temporaries)",
        "torch.optim.AdamW(params, foreach=False)",
    ),
    LeverInfo(
        "fused",
        3,
        "none (the fused kernel is usually faster)",
        False,
        "optimizers built with fused=True where the class accepts it and the parameters are on CUDA",
        "torch.optim.AdamW(params, fused=True)",
    ),
    LeverInfo(
        "gc-threshold",
        4,
        "allocator time: cached blocks are freed and reallocated more often",
        False,
        "the caching allocator's garbage_collection_threshold:0.8 (PYTORCH_CUDA_ALLOC_CONF)",
        "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8",
    ),
    LeverInfo(
        "autocast",
        5,
        "numerics: bfloat16 matmuls/activations (results change)",
        True,
        'the model\'s forward under torch.autocast("cuda") in bfloat16, or float16 where the GPU lacks it',
        'with torch.autocast("cuda", dtype=torch.bfloat16):',
    ),
    LeverInfo(
        "checkpoint",
        6,
        "about one more forward pass of compute",
        False,
        "activation checkpointing of the model's repeated blocks (use_reentrant=False)",
        "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
    ),
)

#: The distributed levers (``sharding``), cheapest first: tried by ``fit --nproc-per-node``.
_SHARDING_INFOS = (
    LeverInfo(
        "zero",
        7,
        "all-reduce of the gradients + broadcast of the updated parameters each step",
        False,
        "each optimizer as torch.distributed.optim.ZeroRedundancyOptimizer "
        "(its state sharded over the ranks)",
        "ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=...)",
    ),
    LeverInfo(
        "fsdp2",
        8,
        "all-gather of the parameters twice + reduce-scatter of the gradients each step",
        False,
        "FSDP2 fully_shard on the model's repeated blocks and on the model, instead of any DDP wrap",
        "for block in model.blocks: fully_shard(block); fully_shard(model)",
    ),
    LeverInfo(
        "no-reshard",
        9,
        "more memory kept after forward, one all-gather of the parameters less each step",
        False,
        "fully_shard(..., reshard_after_forward=False)",
        "fully_shard(module, reshard_after_forward=False)",
    ),
    LeverInfo(
        "fsdp2-bf16",
        10,
        "numerics: bfloat16 parameters in forward and backward (results change); half the all-gather bytes",
        True,
        "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
        "reduce_dtype=torch.float32))",
        "fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
        "reduce_dtype=torch.float32))",
    ),
    LeverInfo(
        "cpu-offload",
        11,
        "host<->GPU copies of the shards each step and the optimizer step on the CPU (much slower)",
        False,
        "fully_shard(..., offload_policy=CPUOffloadPolicy()): shards, gradients and optimizer "
        "state on the CPU",
        "fully_shard(module, offload_policy=CPUOffloadPolicy())",
    ),
)

_BY_NAME = {info.name: info for info in (*_INFOS, *_SHARDING_INFOS)}

#: The lever names, cheapest first (``LeverInfo.rank`` order).
LEVERS: tuple[str, ...] = tuple(info.name for info in _INFOS)

#: The distributed levers' names, cheapest first (``run --lever`` takes them too).
SHARDING_LEVERS: tuple[str, ...] = tuple(info.name for info in _SHARDING_INFOS)


def describe(name: str) -> LeverInfo:
    """The static description of lever ``name`` (cost in words, rank, generic change);
    ``UsageError`` for an unknown name, listing the names."""
    info = _BY_NAME.get(name)
    if info is None:
        raise UsageError(f"unknown lever {name!r}; the levers are: {', '.join((*LEVERS, *SHARDING_LEVERS))}")
    return info


def check_levers(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as given, checked: ``UsageError`` (one line) for an unknown name (listing
    the names) or a name given twice."""
    seen: list[str] = []
    for name in names:
        describe(name)
        if name in seen:
            raise UsageError(f"--lever {name} is given twice")
        seen.append(name)
    return tuple(seen)
