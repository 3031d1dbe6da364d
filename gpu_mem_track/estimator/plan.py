"""The plan types every distributed strategy shares: the :class:`Plan` base (one process,
changing nothing), how FSDP picks its units, how ZeRO partitions parameters and how a
dim-0 shard is cut. ``distributed`` (DDP, ZeRO) and ``fsdp`` (FSDP2) build on these;
see ``distributed``'s docstring for what each strategy adds.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ..dispatch.lifetimes import Lifetimes
from ..errors import UsageError
from .options import DistOptions

__all__ = ["Plan", "fsdp_units", "output_tensors", "shard_rows", "zero_partition"]


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


def shard_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(padded rows, this rank's rows)`` of a dim-0 shard (``torch.chunk``'s split)."""
    padded = math.ceil(rows / world_size)
    return padded, max(0, min(padded, rows - rank * padded))


class Plan:
    """One process: changes nothing. Subclasses add the strategy's storages.

    After :meth:`setup`, ``optimized`` lists the parameters the optimizer steps and
    ``stepped`` those whose gradients the step clears; ``roles`` gives the strategy's
    own persistent storages a category (tensor, category) for the breakdown; ``kept``
    maps a parameter's name to what this rank keeps of it between steps, where that is
    not the parameter itself (FSDP2's shard), for the per-layer table.
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
        self.kept: dict[str, torch.Tensor] = {}
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


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a module's output that need gradients."""
    return [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
