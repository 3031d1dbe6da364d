"""Gives the storages of a simulated step their roles as it runs, then builds the
:class:`~gpu_mem_track.estimator.records.Estimate`.

The built-in step reports its phases through ``on_phase``. A user's step
(``estimate(step=fn)``) is watched through hooks instead: a forward pre-hook and hook
on the model (``"forward"``, then ``"loss"`` until the next backward or optimizer
step), autograd's own state (``"backward"``, see ``Lifetimes.detect_backward``) and
the optimizer's step pre- and post-hooks (``"optimizer step"``, then ``"after step"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..categories import CATEGORIES
from ..dispatch.lifetimes import Lifetimes
from .plan import Plan
from .records import PHASES, Breakdown, Estimate, LayerEstimate, PhasePeak

__all__ = ["Watch"]


class Watch:
    """Follows one simulated run of ``steps`` steps, the last one measured.

    ``state``: the parameters and buffers by name; ``inputs``: the input tensors;
    ``optimizer``: the step's optimizer (None without one); ``on_measure()`` is called as
    the measured step starts (the values' reads restart there). ``plan``: the distributed
    strategy's (None: one process): its own storages get their roles first, its
    ``stepped`` parameters hold the gradients, and under FSDP they (this rank's shards)
    are the parameters counted.
    """

    def __init__(
        self,
        tracker: Lifetimes,
        module: nn.Module,
        state: dict[str, torch.Tensor],
        inputs: list[torch.Tensor],
        optimizer: torch.optim.Optimizer | None,
        steps: int,
        on_measure: Callable[[], None] = lambda: None,
        plan: Plan | None = None,
    ) -> None:
        self.tracker, self.module, self.state, self.optimizer = tracker, module, state, optimizer
        self.on_measure = on_measure
        self.plan = plan
        self.role: dict[int, str] = {}
        for tensor, role in plan.roles if plan is not None else ():
            self._give(tensor, role)
        for tensor in state.values():
            self._give(tensor, "parameter" if isinstance(tensor, nn.Parameter) else "buffer")
        for tensor in inputs:
            self._give(tensor, "input")
        self.measured = steps - 1
        self.step = 0
        self.first_measured_key = 0
        self.activations: set[int] | None = None
        self.gradients: set[int] = set()
        self.states: set[int] = set()
        self.host_bytes = 0

    def _give(self, tensor: torch.Tensor, role: str) -> int | None:
        key = self.tracker.adopt(tensor)
        if key is not None:
            self.role.setdefault(key, role)
        return key

    def on_phase(self, phase: str, step: int) -> None:
        """Close the phase that ended, then open ``phase`` (``run_steps``'s callback)."""
        ended, last = self.tracker.phase, self.step == self.measured
        if ended == "forward" and last and self.activations is None:
            born = range(self.first_measured_key, len(self.tracker.sizes))
            alive = self.tracker.live_keys()
            self.activations = {k for k in born if k in alive and self.tracker.born_in[k][0] == "forward"}
        elif ended == "backward" or (phase in ("optimizer step", "done") and last):
            self._take_gradients()
        if ended == "optimizer step" and self.optimizer is not None:
            self._take_states()
        self.tracker.phase, self.step = phase, step
        if phase == "step start" and step == self.measured:
            self.first_measured_key = len(self.tracker.sizes)
            self.tracker.start_measuring()
            self.on_measure()

    def _take_gradients(self) -> None:
        grads = [p.grad for p in self._stepped() if p.grad is not None]
        found = {k for k in (self._give(g, "gradient") for g in grads) if k is not None}
        if found:
            self.gradients = found

    def _stepped(self) -> list[torch.Tensor]:
        if self.plan is not None:
            return list(self.plan.stepped)
        return [p for p in self.state.values() if isinstance(p, nn.Parameter)]

    def _take_states(self) -> None:
        self.states, self.host_bytes = set(), 0
        for per_param in self.optimizer.state.values():
            for value in per_param.values():
                if not isinstance(value, torch.Tensor):
                    continue
                key = self._give(value, "optimizer_state")
                if key is not None:
                    self.states.add(key)
                else:  # a host tensor (Adam's step with capturable=False) on a CUDA target
                    self.host_bytes += value.untyped_storage().nbytes()

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """Forward hooks keeping ``tracker.modules`` the stack of running modules."""
        handles = []
        for name, sub in self.module.named_modules():
            handles.append(sub.register_forward_pre_hook(self._enter(name)))
            handles.append(sub.register_forward_hook(self._leave, always_call=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def phase_hooks(self) -> Iterator[None]:
        """For a user's step: phases from the model's and the optimizer's hooks and from
        autograd (see the module docstring)."""
        self.tracker.detect_backward = True
        handles = [
            self.module.register_forward_pre_hook(lambda m, a: self._user_phase("forward")),
            self.module.register_forward_hook(lambda m, a, o: self._user_phase("loss"), always_call=True),
        ]
        if self.optimizer is not None:
            handles.append(
                self.optimizer.register_step_pre_hook(lambda o, a, k: self._user_phase("optimizer step"))
            )
            handles.append(
                self.optimizer.register_step_post_hook(lambda o, a, k: self._user_phase("after step"))
            )
        try:
            yield
        finally:
            self.tracker.detect_backward = False
            for handle in handles:
                handle.remove()

    def _user_phase(self, phase: str) -> None:
        self.on_phase(phase, self.step)

    def _enter(self, name: str) -> Callable[..., None]:
        def enter(module: nn.Module, args: Any) -> None:
            self.tracker.modules.append(name)

        return enter

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.tracker.modules:
            self.tracker.modules.pop()

    def _bytes(self, keys: set[int]) -> int:
        return sum(self.tracker.sizes[k] for k in keys)

    def _breakdown(self, keys: set[int]) -> Breakdown:
        parts = dict.fromkeys(CATEGORIES, 0)
        activations = self.activations or set()
        for key in keys - self.tracker.workspace_keys:
            role = self.role.get(key) or ("activation" if key in activations else "other")
            parts[role] += self.tracker.sizes[key]
        return Breakdown(**parts)

    def result(self, header: dict[str, Any]) -> Estimate:
        """The :class:`Estimate` of the measured step, with ``header``'s descriptive fields."""
        tracker = self.tracker
        roles = {
            role: {k for k, r in self.role.items() if r == role} for role in ("parameter", "buffer", "input")
        }
        activations = self.activations or set()
        phases = tuple(PhasePeak(p, *tracker.phase_peaks[p]) for p in PHASES if p in tracker.phase_peaks)
        params = [t for t in self.state.values() if isinstance(t, nn.Parameter)]
        if self.plan is not None and self.plan.options.strategy == "fsdp":
            params = list(self.plan.stepped)  # what this rank keeps: its shards
        caching = tracker.memory.allocator is not None
        return Estimate(
            **header,
            parameters=sum(p.numel() for p in params),
            parameter_bytes=self._bytes(roles["parameter"]),
            buffer_bytes=self._bytes(roles["buffer"]),
            gradient_bytes=self._bytes(self.gradients),
            optimizer_states=len(self.states),
            optimizer_state_bytes=self._bytes(self.states),
            host_bytes=self.host_bytes,
            input_bytes=self._bytes(roles["input"]),
            activation_elements=sum(tracker.elements[k] for k in activations),
            activation_bytes=self._bytes(activations),
            peak=tracker.peak,
            at_peak=self._breakdown(tracker.live_keys(tracker.peak_event)),
            phases=phases,
            layers=self._layers(),
            reserved_peak=tracker.reserved_peak if caching else None,
            reserved_at_peak=tracker.peak_reserved if caching else None,
            largest_free_block=tracker.peak_free_block if caching else None,
            cublas_workspace=self._bytes(tracker.workspace_keys),
        )

    def _layers(self) -> tuple[LayerEstimate, ...]:
        own: dict[str, list[torch.Tensor]] = {}
        kept = self.plan.kept if self.plan is not None else {}
        for name, tensor in self.state.items():
            if isinstance(tensor, nn.Parameter):
                own.setdefault(name.rpartition(".")[0], []).append(kept.get(name, tensor))
        held: dict[str, list[int]] = {}
        for key in self.activations or ():
            held.setdefault(self.tracker.born_in[key][1], []).append(key)
        rows = []
        for name, sub in self.module.named_modules():
            params, keys = own.get(name, []), held.get(name, [])
            if params or keys or not any(True for _ in sub.children()):
                param_keys = {self.tracker.key_of(p) for p in params} - {None}
                rows.append(
                    LayerEstimate(
                        name=name,
                        type=type(sub).__name__,
                        parameters=sum(p.numel() for p in params),
                        parameter_bytes=self._bytes(param_keys),
                        activation_elements=sum(self.tracker.elements[k] for k in keys),
                        activation_bytes=sum(self.tracker.sizes[k] for k in keys),
                    )
                )
        return tuple(rows)
