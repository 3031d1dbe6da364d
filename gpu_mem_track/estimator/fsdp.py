"""FSDP2 (``fully_shard``) on meta tensors: one rank's shards, gathers and reductions.

See ``estimator.distributed`` for the model. Unsharded parameters are kept as FSDP2
keeps them: one Parameter per original, a view of an all-gather output whose storage
is resized to nothing when resharded and back when gathered (the tracker is told, as
no dispatch mode sees a storage resize).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .plan import Plan, fsdp_units, output_tensors, shard_rows

__all__ = ["FSDPPlan"]


@dataclass
class _Param:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    padded_rows: int
    rows: int  # this rank's rows
    padded: torch.Tensor | None = None  # the padded shard (persistent)
    sharded: nn.Parameter | None = None  # this rank's unpadded shard, what the optimizer steps
    output: torch.Tensor | None = None  # all-gather output (resized to 0 when resharded)
    unsharded: nn.Parameter | None = None

    @property
    def padded_numel(self) -> int:
        return self.padded_rows * (self.shape[1:].numel() if len(self.shape) else 1)


@dataclass
class _Unit:
    name: str
    module: nn.Module
    params: list[_Param]
    root: bool
    gathered: bool = False
    prefetched: torch.Tensor | None = None  # a prefetched flat all-gather buffer
    waiting: int = 0  # parameters whose gradient has not been accumulated yet
    handles: list[Any] = field(default_factory=list)


class FSDPPlan(Plan):
    """``fsdp`` (see ``estimator.distributed``)."""

    def setup(self) -> None:
        size, device = self.options.world_size, None
        owned: set[str] = set()
        self.units: list[_Unit] = []
        for unit_name, module in fsdp_units(self.module, self.options.fsdp_units):
            prefix = f"{unit_name}." if unit_name else ""
            params = []
            for name in self.names:
                if name in owned or not name.startswith(prefix):
                    continue
                owned.add(name)
                full = self.state[name]
                device = full.device
                padded, rows = shard_rows(full.shape[0] if full.dim() else 1, size, self.rank)
                params.append(_Param(name, full.shape, full.dtype, padded, rows))
            self.units.append(_Unit(unit_name, module, params, root=not unit_name))
        for unit in self.units:
            for param in unit.params:
                self._shard(param, device)
        # Each non-root unit's DeviceMesh keeps its ranks as an int32 tensor on the host:
        # counted on a CPU target only, as on a GPU it is not device memory.
        self.meshes = [
            torch.empty(size, dtype=torch.int32, device="cpu") for u in self.units if u.params and not u.root
        ]
        for mesh in self.meshes:
            self.tracker.adopt(mesh)
        for unit in self.units:
            for param in unit.params:
                self._unsharded(param)
        self.optimized = [p.sharded for u in self.units for p in u.params]
        self.kept = {p.name: p.sharded for u in self.units for p in u.params}
        self.stepped = self.optimized
        self.rs_inputs: list[torch.Tensor] = []
        self.last_flat: torch.Tensor | None = None
        self.order: list[_Unit] = []  # units by forward order (post-forward)

    def _shard(self, param: _Param, device: Any) -> None:
        param.padded = torch.empty(param.padded_numel, dtype=param.dtype, device=device)
        self.tracker.adopt(param.padded)
        self.roles.append((param.padded, "parameter"))
        rest = param.shape[1:] if len(param.shape) else ()
        local = param.padded[: param.rows * (param.padded_numel // max(param.padded_rows, 1))]
        param.sharded = nn.Parameter(local.view(param.rows, *rest) if len(param.shape) else local.view(()))
        self.state.pop(param.name)  # the full parameter is dropped: only the shard persists

    def _unsharded(self, param: _Param) -> None:
        """The all-gather output (freed at once) and the unsharded Parameter viewing it."""
        numel = param.padded_numel * self.options.world_size
        param.output = torch.empty(numel, dtype=param.dtype, device=param.padded.device)
        param.output.untyped_storage().resize_(0)
        self.tracker.resized(param.output)
        param.unsharded = nn.Parameter(param.output[: param.shape.numel()].view(param.shape))
        self.state[param.name] = param.unsharded

    def on_phase(self, phase: str) -> None:
        if phase == "optimizer step":  # the root's post-backward callback
            self.rs_inputs.clear()
        if phase == "forward":
            self.order.clear()

    # all-gather / reshard

    def _copy_in(self, unit: _Unit) -> torch.Tensor:
        total = sum(p.padded_numel for p in unit.params) * self.options.world_size
        return torch.empty(total, dtype=unit.params[0].dtype, device=unit.params[0].padded.device)

    def _gather(self, unit: _Unit) -> torch.Tensor | None:
        """Copy-out of the unit's all-gather; the flat all-gather buffer, for the caller
        to free (``None`` when the unit is already gathered)."""
        if unit.gathered or not unit.params:
            return None
        flat = unit.prefetched if unit.prefetched is not None else self._copy_in(unit)
        unit.prefetched = None
        for param in unit.params:
            numel = param.padded_numel * self.options.world_size
            param.output.untyped_storage().resize_(numel * param.output.element_size())
            self.tracker.resized(param.output)
        unit.gathered = True
        return flat

    def _reshard(self, unit: _Unit) -> None:
        if not unit.gathered:
            return
        for param in unit.params:
            param.output.untyped_storage().resize_(0)
            self.tracker.resized(param.output)
        unit.gathered = False

    # hooks

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        for unit in self.units:
            unit.handles = [
                unit.module.register_forward_pre_hook(self._pre_forward(unit), prepend=True),
                unit.module.register_forward_hook(self._post_forward(unit)),
            ]
            unit.handles += [
                p.unsharded.register_post_accumulate_grad_hook(self._accumulated(unit)) for p in unit.params
            ]
        try:
            with super().hooks():
                yield
        finally:
            for unit in self.units:
                for handle in unit.handles:
                    handle.remove()

    def _pre_forward(self, unit: _Unit) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            flat = self._gather(unit)
            if flat is not None and self.options.world_size > 1:
                # FSDP2 frees a forward all-gather buffer after the next unit's copy-out
                self.last_flat = flat
            del flat
            unit.waiting = len(unit.params)

        return hook

    def _post_forward(self, unit: _Unit) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if unit.root:
                self.last_flat = None  # the root's post-forward frees the last one
                return
            self.order.append(unit)
            if self.options.reshard_after_forward:
                self._reshard(unit)
            tensors = output_tensors(output)
            if tensors:
                handle = torch.autograd.graph.register_multi_grad_hook(
                    tensors, lambda grads: self._pre_backward(unit), mode="any"
                )
                unit.handles.append(handle)

        return hook

    def _pre_backward(self, unit: _Unit) -> None:
        self._gather(unit)  # in backward the flat buffer is freed after the copy-out
        index = self.order.index(unit)
        if index > 0:  # prefetch the unit before it (backward runs in reverse)
            target = self.order[index - 1]
            if not target.gathered and target.prefetched is None and target.params:
                target.prefetched = self._copy_in(target)

    def _accumulated(self, unit: _Unit) -> Any:
        def hook(param: torch.Tensor) -> None:
            unit.waiting -= 1
            if unit.waiting == 0:
                self._post_backward(unit)

        return hook

    def _post_backward(self, unit: _Unit) -> None:
        grads = [p.unsharded.grad for p in unit.params if p.unsharded.grad is not None]
        for param in unit.params:
            param.unsharded.grad = None
        self._reshard(unit)
        self.rs_inputs.clear()  # at most one reduce-scatter input kept in flight
        device, dtype = unit.params[0].padded.device, unit.params[0].dtype
        size = self.options.world_size
        numel = sum(p.padded_numel for p in unit.params)
        rs_input = torch.empty(numel * size, dtype=dtype, device=device)
        last = grads.pop() if grads else None  # freed after the reduce-scatter (as measured)
        del grads
        output = torch.empty(numel, dtype=dtype, device=device)
        # gloo's reduce-scatter works on a copy of its input, freed once it returns
        torch.empty(numel * size, dtype=dtype, device=device)
        del last
        offset = 0
        for param in unit.params:
            param.sharded.grad = output[offset : offset + param.sharded.numel()].view_as(param.sharded)
            offset += param.padded_numel
        self.rs_inputs.append(rs_input)
