"""The estimator: one training (or inference) step simulated on meta tensors, no GPU needed.

The model is built on PyTorch's ``meta`` device, where tensors have shapes, dtypes and
storage sizes but no data, so nothing real is allocated. A dispatch mode
(:class:`~gpu_mem_track.estimator.lifetimes.Lifetimes`) follows every storage from birth to death
through two identical steps; the second is measured. For a CUDA target each storage
counts as the caching allocator's 512 B-rounded block, which is what
``torch.cuda.memory_allocated`` and ``max_memory_allocated`` count; the allocator's
segment rounding (2 MiB for small requests, 20 MiB segments or 2 MiB multiples for
large ones) changes *reserved* memory, not allocated, and is not modelled, nor are
library workspaces (cuBLAS, cuDNN) and the reuse of a cached block up to 1 MiB larger
than asked, which the allocator counts whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from ..categories import CATEGORIES
from ..devices import DEVICE_FORMS
from ..errors import UsageError
from ..units import cuda_block_bytes
from .amp import SimulatedAutocast
from .distributed import Plan, estimate_ranks, make_plan
from .lifetimes import Lifetimes
from .options import DistOptions, StepOptions
from .records import PHASES, Breakdown, Estimate, LayerEstimate, PhasePeak
from .step import (
    InputsLike,
    OptimizerLike,
    as_specs,
    build_model,
    default_loss,
    describe,
    make_inputs,
    make_optimizer,
    run_steps,
)

__all__ = ["estimate", "estimate_step", "trace_cpu_step"]

ModelLike = Any  # an nn.Module, or a callable returning one


def estimate(
    model: ModelLike,
    inputs: InputsLike,
    *,
    optimizer: OptimizerLike = "adam",
    dtype: str | torch.dtype | None = None,
    amp: bool | str | torch.dtype = False,
    training: bool = True,
    device: str = "cuda",
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    world_size: int = 1,
    strategy: str | None = None,
    bucket_cap_mb: float | None = None,
    gradient_as_bucket_view: bool = False,
    fsdp_units: tuple[str, ...] = (),
    reshard_after_forward: bool = True,
) -> Estimate:
    """Estimate the device memory of one step of ``model`` on ``inputs``, on meta tensors.

    ``model`` is an ``nn.Module`` (its parameters are copied as meta tensors; the module
    is not changed) or a factory returning one (called with ``meta`` as the default
    device, so even a huge model costs nothing). ``inputs`` is a tensor, a shape
    (``(64, 3, 32, 32)``), an :class:`~gpu_mem_track.estimator.specs.InputSpec`, or a sequence of
    those, passed positionally. ``optimizer``: ``"adam"``, ``"adamw"``, ``"sgd"``
    (momentum 0.9), ``"none"``, or a callable ``params -> Optimizer``. ``dtype`` casts
    the model's floating parameters, buffers and inputs (``"bf16"``, ``"fp16"``, ...).
    ``amp`` (``True`` for float16, or a dtype) simulates CUDA autocast around forward and
    loss (see :mod:`~gpu_mem_track.estimator.amp` for what is modelled). ``training=False``
    runs one forward pass under ``torch.no_grad()`` in eval mode. ``device`` is the
    target: ``"cuda"`` (512 B block rounding, foreach optimizers, Adam's ``step`` on the
    host) or ``"cpu"`` (exact sizes). ``loss_fn(output)`` defaults to the sum of the
    outputs. ``world_size`` and ``strategy`` (``"ddp"``, ``"zero1"``, ``"zero2"``,
    ``"fsdp"``; ``"ddp"`` by default over one rank) with ``bucket_cap_mb``,
    ``gradient_as_bucket_view`` (DDP), ``fsdp_units`` and ``reshard_after_forward``
    (FSDP2) estimate one rank of a distributed step (see
    :mod:`~gpu_mem_track.estimator.distributed`; the batch is per rank). The options are parsed once into a
    :class:`~gpu_mem_track.estimator.options.StepOptions` (``estimate_step`` takes one).
    Returns the :class:`~gpu_mem_track.estimator.records.Estimate`.
    """
    distributed = DistOptions.parse(
        world_size=world_size,
        strategy=strategy,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        fsdp_units=fsdp_units,
        reshard_after_forward=reshard_after_forward,
    )
    options = _options(
        dtype=dtype, amp=amp, optimizer=optimizer, training=training, device=device, distributed=distributed
    )
    return estimate_step(model, inputs, options, loss_fn=loss_fn)


def estimate_step(
    model: ModelLike,
    inputs: InputsLike,
    options: StepOptions,
    *,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
) -> Estimate:
    """:func:`estimate` with its options already parsed. With ``options.distributed``
    spread over ranks, each distinct rank is simulated (``estimator.distributed``) and
    the rank with the highest peak is returned, with every rank's peak in ``ranks``."""
    dist = options.distributed
    if dist.world_size == 1 or dist.strategy == "none" or not options.training:
        return _trace(model, inputs, options, loss_fn, sim="meta")
    return estimate_ranks(lambda rank: _trace(model, inputs, options, loss_fn, "meta", rank), model, dist)


def trace_cpu_step(
    model: ModelLike,
    inputs: InputsLike,
    *,
    optimizer: OptimizerLike = "adam",
    dtype: str | torch.dtype | None = None,
    training: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
) -> Estimate:
    """Run the same step on real CPU tensors and measure it the same way (for validation).

    The figures are the live bytes of real CPU storages, measured, not estimated; the
    model is built (or copied) on the CPU, so this allocates real memory.
    """
    options = _options(dtype=dtype, amp=False, optimizer=optimizer, training=training, device="cpu")
    return _trace(model, inputs, options, loss_fn, sim="cpu")


def _options(**given: Any) -> StepOptions:
    try:
        return StepOptions.parse(**given)
    except UsageError as exc:
        if str(exc).startswith("not a device") or str(exc).startswith("device must"):
            raise UsageError(
                f"the estimator targets cuda or cpu, not {given['device']!r} (valid forms: {DEVICE_FORMS})"
            ) from None
        raise


def _trace(
    model: ModelLike,
    inputs: InputsLike,
    options: StepOptions,
    loss_fn: Callable[[Any], torch.Tensor],
    sim: str,
    rank: int = 0,
) -> Estimate:
    cast, amp_dtype = options.torch_dtype, options.amp_dtype
    training, target = options.training, options.target
    specs = as_specs(inputs)
    name = _model_name(model)
    module = model if isinstance(model, nn.Module) else build_model(model, sim)
    size_of = cuda_block_bytes if target == "cuda" else (lambda nbytes: nbytes)
    tracker = Lifetimes({sim} if target == "cuda" else {sim, "cpu"}, size_of)
    was_training = module.training
    module.train(training)
    try:
        # Made before tracking starts, then adopted: copying must not count the originals.
        state = _state(module, sim, cast, private=isinstance(model, nn.Module))
        tensors = make_inputs(specs, sim, cast)
        with tracker:
            plan = make_plan(options.distributed if training else DistOptions(), module, state, rank, tracker)
            plan.setup()
            opt = make_optimizer(options.optimizer, plan.optimized, target) if training else None
            watch = _Watch(tracker, module, state, tensors, opt, plan)
            with watch.hooks(), plan.hooks():
                run_steps(
                    lambda: functional_call(module, state, tuple(tensors)),
                    plan.stepped,
                    opt,
                    training=training,
                    steps=2 if training else 1,
                    loss_fn=loss_fn,
                    autocast=(lambda: SimulatedAutocast(amp_dtype)) if amp_dtype else contextlib.nullcontext,
                    on_phase=lambda phase, step: (plan.on_phase(phase), watch.on_phase(phase, step)),
                )
            header = dict(
                model=name,
                device=target,
                rounding="512 B blocks (CUDA caching allocator)"
                if target == "cuda"
                else "none (exact sizes)",
                training=training,
                optimizer=options.optimizer_name if training else "none",
                dtype=options.dtype or "as built",
                amp=amp_dtype is not None,
                inputs=tuple(describe(t) for t in tensors),
                world_size=options.distributed.world_size,
                strategy=options.distributed.strategy,
                rank=rank,
            )
            return watch.result(header)
    finally:
        tracker.close()
        module.train(was_training)


def _model_name(model: ModelLike) -> str:
    if isinstance(model, nn.Module):
        return type(model).__name__
    return f"{getattr(model, '__module__', '?')}:{getattr(model, '__qualname__', repr(model))}"


def _state(
    module: nn.Module, device: str, cast: torch.dtype | None, private: bool
) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers on ``device``, floating ones cast to ``cast``.

    With ``private`` (the caller's own module) real tensors are always copied, so the
    step never updates the caller's weights.
    """
    state: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():
        state[name] = nn.Parameter(_convert(param, device, cast, private), requires_grad=param.requires_grad)
    for name, buffer in module.named_buffers():
        state[name] = _convert(buffer, device, cast, private)
    return state


def _convert(tensor: torch.Tensor, device: str, cast: torch.dtype | None, private: bool) -> torch.Tensor:
    dtype = cast if cast is not None and tensor.is_floating_point() else tensor.dtype
    copy = tensor.detach().to(device=device, dtype=dtype)
    if (
        private
        and device != "meta"
        and copy.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    ):
        copy = copy.clone()
    return copy


class _Watch:
    """Gives storages their roles as the step runs, then builds the :class:`Estimate`."""

    def __init__(
        self,
        tracker: Lifetimes,
        module: nn.Module,
        state: dict[str, torch.Tensor],
        inputs: list[torch.Tensor],
        optimizer: torch.optim.Optimizer | None,
        plan: Plan,
    ) -> None:
        self.tracker, self.module, self.state, self.optimizer = tracker, module, state, optimizer
        self.stepped = plan.stepped
        self.role: dict[int, str] = {}
        for tensor, role in plan.roles:
            self._give(tensor, role)
        for tensor in state.values():
            self._give(tensor, "parameter" if isinstance(tensor, nn.Parameter) else "buffer")
        for tensor in inputs:
            self._give(tensor, "input")
        self.measured = 1 if module.training else 0
        self.step = 0
        self.first_measured_key = 0
        self.activations: set[int] = set()
        self.gradients: set[int] = set()
        self.states: set[int] = set()
        self.host_bytes = 0

    def _give(self, tensor: torch.Tensor, role: str) -> int | None:
        key = self.tracker.adopt(tensor)
        if key is not None:
            self.role.setdefault(key, role)
        return key

    def on_phase(self, phase: str, step: int) -> None:
        """``run_steps`` callback: close the phase that ended, then open ``phase``."""
        ended, last = self.tracker.phase, self.step == self.measured
        if ended == "forward" and last:
            born = range(self.first_measured_key, len(self.tracker.sizes))
            alive = self.tracker.live_keys()
            self.activations = {k for k in born if k in alive and self.tracker.born_in[k][0] == "forward"}
        elif ended == "backward":
            grads = [p.grad for p in self.stepped if p.grad is not None]
            self.gradients = {k for k in (self._give(g, "gradient") for g in grads) if k is not None}
        elif ended == "optimizer step" and self.optimizer is not None:
            self._take_states()
        self.tracker.phase, self.step = phase, step
        if phase == "step start" and step == self.measured:
            self.first_measured_key = len(self.tracker.sizes)
            self.tracker.start_measuring()

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
    def hooks(self) -> Any:
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
        for key in keys:
            role = self.role.get(key) or ("activation" if key in self.activations else "other")
            parts[role] += self.tracker.sizes[key]
        return Breakdown(**parts)

    def result(self, header: dict[str, Any]) -> Estimate:
        """The :class:`Estimate` of the measured step, with ``header``'s descriptive fields."""
        tracker = self.tracker
        roles = {
            role: {k for k, r in self.role.items() if r == role} for role in ("parameter", "buffer", "input")
        }
        phases = tuple(PhasePeak(p, *tracker.phase_peaks[p]) for p in PHASES if p in tracker.phase_peaks)
        params = [t for t in self.state.values() if isinstance(t, nn.Parameter)]
        if header["world_size"] > 1 and header["strategy"] == "fsdp":
            params = list(self.stepped)  # what this rank keeps: its shards
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
            activation_elements=sum(tracker.elements[k] for k in self.activations),
            activation_bytes=self._bytes(self.activations),
            peak=tracker.peak,
            at_peak=self._breakdown(tracker.live_keys(tracker.peak_event)),
            phases=phases,
            layers=self._layers(),
        )

    def _layers(self) -> tuple[LayerEstimate, ...]:
        own: dict[str, list[torch.Tensor]] = {}
        for name, tensor in self.state.items():
            if isinstance(tensor, nn.Parameter):
                own.setdefault(name.rpartition(".")[0], []).append(tensor)
        held: dict[str, list[int]] = {}
        for key in self.activations:
            held.setdefault(self.tracker.born_in[key][1], []).append(key)
        rows = []
        for name, sub in self.module.named_modules():
            params, keys = own.get(name, []), held.get(name, [])
            if params or keys or not any(True for _ in sub.children()):
                size_of = self.tracker.size_of
                rows.append(
                    LayerEstimate(
                        name=name,
                        type=type(sub).__name__,
                        parameters=sum(p.numel() for p in params),
                        parameter_bytes=sum(size_of(p.untyped_storage().nbytes()) for p in params),
                        activation_elements=sum(self.tracker.elements[k] for k in keys),
                        activation_bytes=sum(self.tracker.sizes[k] for k in keys),
                    )
                )
        return tuple(rows)
