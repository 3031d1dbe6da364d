"""The estimator: one training (or inference) step simulated on meta tensors, no GPU needed.

The model is built on PyTorch's ``meta`` device, where tensors have shapes, dtypes and
storage sizes but no data, so nothing real is allocated. A dispatch mode
(:class:`~gpu_mem_track.dispatch.lifetimes.Lifetimes`) follows every storage from birth to death
through two identical steps (the built-in step, or the user's own); the second is
measured. Code that reads a tensor's value (``.item()``, mask checks) gets it from
:class:`~gpu_mem_track.dispatch.values.KnownValues`. For a CUDA target every storage is
allocated from a model of PyTorch's caching allocator (``gpu_mem_track.allocator``, see
:mod:`~gpu_mem_track.dispatch.memory`): allocated bytes count whole blocks (512 B
rounding, a large block up to 1 MiB over the request handed out whole), as
``max_memory_allocated`` does, reserved bytes count the allocator's segments, and the
cuBLAS workspaces (one per handle: forward and backward) are allocated at the first
matmul-like op of each; convolutions take cuDNN's workspaces and ``cudnn.benchmark``'s
trials (:mod:`~gpu_mem_track.gpumodel.cudnn`); an ``addmm`` with a bias vector takes
cuBLASLt's workspace and a sum split across thread blocks CUDA's reduction staging
(:mod:`~gpu_mem_track.gpumodel.reduce`, sized by the target GPU's SM count, see
:func:`~gpu_mem_track.estimator.target.target_spec`). Not modelled: CUDA graphs, other
streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils.stateless import _reparametrize_module

from ..devices import DEVICE_FORMS
from ..dispatch.lifetimes import Lifetimes
from ..errors import UsageError
from .distributed import estimate_ranks, make_plan
from .options import DistOptions, StepOptions
from .plan import Plan
from .records import Estimate
from .specs import callable_name
from .step import (
    InputsLike,
    OptimizerLike,
    StepFunction,
    as_specs,
    build_model,
    check_user_step,
    default_loss,
    describe,
    make_inputs,
    make_optimizer,
    run_steps,
    run_user_steps,
    split_named,
)
from .target import open_target
from .watch import Watch

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
    step: StepFunction | None = None,
    alloc_conf: str | None = None,
    gpu: str | None = None,
    cublas_workspace: int | str | None = None,
    warmup: int | None = None,
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
    (``(64, 3, 32, 32)``), its text as the command line takes it (``"64x3x32x32"``,
    ``"32x128:int64"``), an :class:`~gpu_mem_track.estimator.specs.InputSpec`, or a sequence of
    those, passed positionally (an ``InputSpec`` with a ``name`` by keyword).
    ``optimizer``: ``"adam"``, ``"adamw"``, ``"sgd"`` (momentum 0.9), ``"none"``, or a
    callable ``params -> Optimizer``. ``dtype`` casts the model's floating parameters,
    buffers and inputs (``"bf16"``, ``"fp16"``, ...). ``amp`` (``True`` for float16, or a
    dtype) runs forward and loss under ``torch.autocast("cuda")`` on the simulated GPU (see
    :mod:`~gpu_mem_track.gpumodel.autocast` for what is modelled; CUDA target only).
    ``training=False`` runs one forward pass under ``torch.no_grad()`` in eval mode.
    ``device`` is the target: ``"cuda"`` (the simulated GPU, see
    :mod:`~gpu_mem_track.estimator.target`: the caching allocator's model, foreach
    optimizers, Adam's ``step`` on the host) or ``"cpu"`` (exact sizes, no allocator).
    ``loss_fn(output)`` defaults to the output's own ``loss`` when it has one, else the
    sum of its floating tensors
    (:func:`~gpu_mem_track.estimator.step.default_loss`). Values the model's code reads
    from tensors are computed for real or replaced by placeholders, and listed in
    ``value_reads`` (see :mod:`~gpu_mem_track.dispatch.values`).

    ``step``: your own step instead of the built-in one, called as
    ``step(model, optimizer, inputs)`` with the simulated model (its parameters on the
    meta device), the optimizer made from ``optimizer`` (None for ``"none"``) and the
    list of input tensors in the order given (keyword inputs included); it runs twice
    and the second call is measured. Whatever it returns stays alive until the next call
    returns (as ``out = step(...)`` in a loop); a tensor the loop body itself keeps bound
    (``out = model(x)``, which frees the previous output once the new one exists) is
    modelled by keeping it in state of the step's own (a closure or a dict). The step
    computes its own loss and runs its own autocast: giving ``loss_fn`` or ``amp`` with
    it is a ``UsageError``; ``training`` only sets the model's mode.

    ``warmup``: how many steps run before the measured one (None: 1 for training or a
    user's step, so the optimizer state exists as in a training loop; 0 for inference).
    ``warmup=0`` measures the very first step, with a fresh optimizer.

    CUDA target only: ``alloc_conf`` is a ``PYTORCH_CUDA_ALLOC_CONF`` value (None: the
    environment variable); ``gpu`` names the simulated GPU: an architecture
    (``"hopper"``: 32 MiB cuBLAS workspaces, see
    :data:`~gpu_mem_track.gpumodel.workspace.GPU_ARCHITECTURES`) with unbounded memory
    (None: ``"ampere"``), or a GPU of the catalog (``"a100-40gb"``, ``"24GiB:sm86"``,
    see :mod:`~gpu_mem_track.simgpu.catalog`), whose capacity a step may exceed
    (``torch.OutOfMemoryError``); ``cublas_workspace`` overrides the workspace: bytes,
    or a ``CUBLAS_WORKSPACE_CONFIG`` value (None: the environment variable, else the
    GPU's default). Each rank of a distributed estimate runs on its own simulated GPU,
    as one process does.

    ``world_size`` and ``strategy`` (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"fsdp"``;
    ``"ddp"`` by default over one rank) with ``bucket_cap_mb``,
    ``gradient_as_bucket_view`` (DDP), ``fsdp_units`` and ``reshard_after_forward``
    (FSDP2) estimate one rank of a distributed training step (see
    :mod:`~gpu_mem_track.estimator.distributed`; the batch is per rank); not with
    ``step`` (``UsageError``).

    The options are parsed once into a
    :class:`~gpu_mem_track.estimator.options.StepOptions` (``estimate_step`` takes one).
    Returns the :class:`~gpu_mem_track.estimator.records.Estimate`.
    """
    options = _options(
        dtype=dtype,
        amp=amp,
        optimizer=optimizer,
        training=training,
        device=device,
        warmup=warmup,
        alloc_conf=alloc_conf,
        gpu=gpu,
        cublas_workspace=cublas_workspace,
        distributed=DistOptions.parse(
            world_size=world_size,
            strategy=strategy,
            bucket_cap_mb=bucket_cap_mb,
            gradient_as_bucket_view=gradient_as_bucket_view,
            fsdp_units=fsdp_units,
            reshard_after_forward=reshard_after_forward,
        ),
    )
    return estimate_step(model, inputs, options, loss_fn=loss_fn, step=step)


def estimate_step(
    model: ModelLike,
    inputs: InputsLike,
    options: StepOptions,
    *,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    step: StepFunction | None = None,
) -> Estimate:
    """:func:`estimate` with its options already parsed (the CUDA target's memory model
    and the warmup come from ``options``). With ``options.distributed`` spread over
    ranks, each distinct rank is simulated (``estimator.distributed``), each through its
    own memory model, and the rank with the highest peak is returned, with every rank's
    peak in ``ranks``. A user's ``step`` cannot be combined with a strategy
    (``UsageError``, see :func:`~gpu_mem_track.estimator.step.check_user_step`)."""
    dist = options.distributed
    with _apart_from_modes():
        if step is not None or dist.world_size == 1 or dist.strategy == "none" or not options.training:
            return _trace(model, inputs, options, loss_fn, "meta", step)
        return estimate_ranks(
            lambda rank: _trace(model, inputs, options, loss_fn, "meta", None, rank), model, dist
        )


@contextlib.contextmanager
def _apart_from_modes() -> Any:
    """Run an estimate with the caller's torch-function and dispatch modes set aside: on a
    simulated GPU (``simulated_gpu``, ``run --simulate``) the face would show the
    estimate's meta tensors as CUDA ones (its inputs went uncounted, 4 MiB short on a
    16384 x 64 batch) and the simulated allocator would hold them too."""
    from torch.overrides import _pop_mode, _push_mode
    from torch.utils._python_dispatch import _disable_current_modes

    functions = [_pop_mode() for _ in range(torch._C._len_torch_function_stack())]
    try:
        with _disable_current_modes():
            yield
    finally:
        for mode in reversed(functions):
            _push_mode(mode)


def trace_cpu_step(
    model: ModelLike,
    inputs: InputsLike,
    *,
    optimizer: OptimizerLike = "adam",
    dtype: str | torch.dtype | None = None,
    training: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    step: StepFunction | None = None,
    warmup: int | None = None,
) -> Estimate:
    """Run the same step on real CPU tensors and measure it the same way (for validation).

    The figures are the live bytes of real CPU storages, measured, not estimated; the
    model is built (or copied) on the CPU, so this allocates real memory.
    """
    options = _options(
        dtype=dtype, amp=False, optimizer=optimizer, training=training, device="cpu", warmup=warmup
    )
    return _trace(model, inputs, options, loss_fn, "cpu", step)


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
    step: StepFunction | None,
    rank: int = 0,
) -> Estimate:
    if step is not None:
        check_user_step(options, loss_fn)
    warmup = options.warmup
    if warmup is None:
        warmup = 1 if options.training or step is not None else 0
    specs = as_specs(inputs)
    module = model if isinstance(model, nn.Module) else build_model(model, sim)
    target = open_target(options, sim, user_code=step is not None)
    tracker, values = target.tracker, target.values
    was_training = module.training
    module.train(options.training)
    try:
        # Made before tracking starts, then adopted: copying must not count the originals.
        state = _state(module, sim, options.torch_dtype, private=isinstance(model, nn.Module))
        with values or contextlib.nullcontext():  # the values' own ops are never counted
            tensors = make_inputs(specs, sim, options.torch_dtype)
        with target.running():
            dist = options.distributed if options.training and step is None else DistOptions()
            plan = make_plan(dist, module, state, rank, tracker)
            plan.setup()
            make = options.training or step is not None
            opt = make_optimizer(options.optimizer, plan.optimized, options.target) if make else None
            restart = values.restart if values is not None else (lambda: None)
            watch = Watch(tracker, module, state, tensors, opt, warmup + 1, on_measure=restart, plan=plan)
            with watch.hooks(), plan.hooks():
                if step is None:
                    _builtin_steps(module, state, (specs, tensors), plan, opt, options, loss_fn, watch)
                else:
                    with _reparametrize_module(module, state), watch.phase_hooks():
                        run_user_steps(step, module, opt, tensors, steps=warmup + 1, on_phase=watch.on_phase)
            header = _header(model, options, (specs, tensors), tracker, (step, loss_fn))
            spread = options.distributed
            header.update(world_size=spread.world_size, strategy=spread.strategy, rank=rank)
            header["value_reads"] = values.reads() if values is not None else ()
            return watch.result(header)
    finally:
        target.close()
        module.train(was_training)


def _builtin_steps(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    inputs: tuple[list[Any], list[torch.Tensor]],
    plan: Plan,
    opt: torch.optim.Optimizer | None,
    options: StepOptions,
    loss_fn: Callable[[Any], torch.Tensor],
    watch: Watch,
) -> None:
    """The built-in step, ``watch.measured + 1`` times; ``inputs`` are (specs, tensors):
    inputs whose spec has a name go by keyword. ``plan`` (the distributed strategy's, a
    no-op for one process) gives the parameters stepped and hears every phase."""
    amp_dtype = options.amp_dtype
    args, kwargs = split_named(*inputs)
    run_steps(
        lambda: functional_call(module, state, args, kwargs),
        plan.stepped,
        opt,
        training=options.training,
        steps=watch.measured + 1,
        loss_fn=loss_fn,
        autocast=(lambda: torch.autocast("cuda", dtype=amp_dtype)) if amp_dtype else contextlib.nullcontext,
        on_phase=lambda phase, step: (plan.on_phase(phase), watch.on_phase(phase, step)),
    )


def _header(
    model: ModelLike,
    options: StepOptions,
    inputs: tuple[list[Any], list[torch.Tensor]],
    tracker: Lifetimes,
    user: tuple[StepFunction | None, Callable[[Any], torch.Tensor]],
) -> dict[str, Any]:
    """The estimate's descriptive fields; ``inputs`` are (specs, tensors), ``user`` the
    user's step (None: the built-in one) and the loss function."""
    step, loss_fn = user
    caching = tracker.memory.allocator is not None
    conf = tracker.memory.allocator.settings.conf_string() if caching else ""
    rounding = f"CUDA caching allocator ({conf or 'default settings'})" if caching else "none (exact sizes)"
    return dict(
        model=_model_name(model),
        device=options.target,
        rounding=rounding,
        training=options.training,
        optimizer=options.optimizer_name if options.training or step is not None else "none",
        dtype=options.dtype or "as built",
        amp=options.amp_dtype is not None and step is None,
        inputs=tuple(describe(t, getattr(s, "name", "")) for s, t in zip(*inputs)),
        loss="default" if loss_fn is default_loss else callable_name(loss_fn),
        allocator=conf,
        step=callable_name(step) if step is not None else "",
    )


def _model_name(model: ModelLike) -> str:
    if isinstance(model, nn.Module):
        return type(model).__name__
    return callable_name(model)


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
