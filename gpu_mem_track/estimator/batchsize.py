"""The batch-size finder: the largest batch whose step peak fits a memory budget.

It never searches by crashing into out-of-memory errors: the search (``search``:
``search_batch_size``, re-exported here) evaluates the peak at a few small batches, fits
``peak(batch) = intercept + slope * batch``, jumps to the batch the line predicts,
confirms there, and only then narrows (interpolating, with bisection as a safeguard) if
the prediction was off. Peaks come from the estimator (no GPU, the
default) or from real steps measured with the CUDA allocator's peak statistics; on a
CUDA target the budget limits reserved bytes (the allocator's segments, what runs out)
unless told to limit allocated bytes.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..devices import Device
from ..errors import UsageError
from .options import DistOptions, StepOptions
from .records import BatchSizeResult
from .search import PeakFunction, search_batch_size
from .simulate import ModelLike, estimate_step
from .specs import InputSpec
from .step import (
    StepFunction,
    as_specs,
    build_model,
    check_user_step,
    default_loss,
    make_inputs,
    make_optimizer,
    run_steps,
    run_user_steps,
    split_named,
)
from .target import UNBOUNDED, DoesNotFit, capacity_text, target_spec

__all__ = ["BUDGET_ON", "PeakMeter", "find_max_batch_size", "search_batch_size"]

#: Reads a measured peak: runs the step it is given on the device and returns its peak
#: bytes above what was allocated before, or None when it ran out of memory.
PeakMeter = Callable[[Callable[[], Any], Device], "int | None"]


#: What a budget limits: the allocator's reserved bytes (segments: what runs out) or
#: the allocated bytes (blocks handed out to tensors).
BUDGET_ON = ("reserved", "allocated")


def find_max_batch_size(
    model: ModelLike | None = None,
    inputs: Any = None,
    *,
    step: Callable[[int], Any] | None = None,
    budget: int | None = None,
    measure: bool = False,
    device: str = "cuda",
    optimizer: Any = "adam",
    dtype: Any = None,
    amp: Any = False,
    training: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    samples: Sequence[int] = (1, 2, 4),
    max_batch: int = 1 << 20,
    meter: PeakMeter | None = None,
    budget_on: str = "reserved",
    model_step: StepFunction | None = None,
    warmup: int | None = None,
    alloc_conf: str | None = None,
    gpu: str | None = None,
    cublas_workspace: int | str | None = None,
    distributed: DistOptions | None = None,
) -> BatchSizeResult:
    """The largest batch of ``model`` on ``inputs`` whose step fits ``budget`` bytes.

    ``inputs`` are shapes (or :class:`~gpu_mem_track.estimator.specs.InputSpec`) whose first size
    is the batch; it is replaced by each batch tried. Peaks come from :func:`estimate`
    (``device`` sets the target; ``model_step``, ``warmup``, ``alloc_conf``, ``gpu`` and
    ``cublas_workspace`` are passed on as its ``step`` and other options) unless
    ``measure``, which runs real steps on the CUDA ``device`` and reads each one's peak
    above the memory held before the first (this resets the device's peak statistics and,
    for a reserved budget, empties the allocator's cache before each step).
    ``budget_on``: ``"reserved"`` (the default: the caching allocator's segments, what
    runs out; ``max_memory_reserved`` when measured) or ``"allocated"``
    (``max_memory_allocated``); on the CPU target both are the exact bytes. Instead of a
    model, ``step(batch)`` may run one step of the caller's own; it is always measured.
    ``meter(run, device)`` replaces the CUDA allocator reading (it runs ``run()`` and
    returns the peak bytes, None when out of memory), for example to measure on the CPU.
    ``budget`` defaults to the capacity of the GPU ``gpu`` names (a catalog GPU, with
    estimated peaks; its total memory less its non-PyTorch memory, a saved probe result's
    where there is one; a probe that runs out of it does not fit), else the CUDA device's
    free memory (``torch.cuda.mem_get_info``); without either it must be given. With
    measured peaks the batch above the answer is not run (it would exceed the budget):
    the fitted slope must predict it does not fit.
    ``optimizer``, ``dtype``, ``amp``, ``training`` and ``loss_fn`` are as for :func:`estimate`;
    the options are parsed once into a :class:`~gpu_mem_track.estimator.options.StepOptions`.
    ``distributed`` (a :class:`~gpu_mem_track.estimator.options.DistOptions`) estimates
    one rank of a distributed step (each rank through its own allocator model on the
    CUDA target), the highest rank's peak against the budget; the batch is per rank. It
    is estimated only, never measured, and not with ``model_step``.
    """
    if (step is None) == (model is None):
        raise UsageError("give either a model (with inputs) or a step function")
    if budget_on not in BUDGET_ON:
        raise UsageError(f"budget_on must be one of {', '.join(BUDGET_ON)}, not {budget_on!r}")
    options = StepOptions.parse(
        dtype=dtype,
        amp=amp,
        optimizer=optimizer,
        training=training,
        device=device,
        warmup=warmup,
        alloc_conf=alloc_conf,
        gpu=gpu,
        cublas_workspace=cublas_workspace,
        distributed=distributed,
    )
    if (measure or step is not None) and options.distributed.world_size > 1:
        raise UsageError("a distributed step is estimated only: drop --measure (or the step function)")
    if model_step is not None:
        check_user_step(options, loss_fn)
    measured = measure or step is not None
    budget, budget_source = _budget(budget, options, measured)
    read = meter or _CudaPeaks(budget_on)
    if step is not None:
        peak_of = lambda b: read(lambda: step(b), options.device)  # noqa: E731
        source = f"measured step on {options.device}"
    else:
        specs = [
            s if isinstance(s, InputSpec) else InputSpec(tuple(s.shape), s.dtype) for s in _specs(inputs)
        ]
        if measured:
            peak_of = _measured_peaks(model, specs, options, read, (model_step, loss_fn))
            source = f"measured steps on {options.device}"
        else:
            peak_of = _estimated_peaks(model, specs, options, (model_step, loss_fn), budget_on)
            source = f"estimator ({options.target} target{_per_rank(options.distributed)})"
    if options.target == "cuda":
        source += f", peak {budget_on}"
    return search_batch_size(
        peak_of,
        budget,
        samples=samples,
        max_batch=max_batch,
        confirm_above=not measured,
        source=source,
        budget_source=budget_source,
    )


def _estimated_peaks(
    model: Any,
    specs: list[InputSpec],
    options: StepOptions,
    user: tuple[StepFunction | None, Callable[[Any], torch.Tensor]],
    budget_on: str,
) -> PeakFunction:
    """Peaks from the estimator; ``user`` is the user's step (None: the built-in one) and
    the loss function."""
    step, loss_fn = user

    def peak_of(batch: int) -> int | None:
        try:
            est = estimate_step(model, _rebatch(specs, batch), options, loss_fn=loss_fn, step=step)
        except DoesNotFit:
            return None  # ran out of the named GPU's memory
        if budget_on == "reserved" and est.reserved_peak is not None:
            return est.reserved_peak
        return est.peak

    return peak_of


def _per_rank(dist: DistOptions) -> str:
    if dist.world_size == 1 or dist.strategy == "none":
        return ""
    return f", {dist.strategy} over {dist.world_size} ranks, batch per rank"


def _specs(inputs: Any) -> list[Any]:
    if inputs is None:
        raise UsageError("the finder needs the inputs' shapes (batch first)")
    return as_specs(inputs)


def _rebatch(specs: list[InputSpec], batch: int) -> list[InputSpec]:
    return [InputSpec((batch, *spec.shape[1:]), spec.dtype, spec.name) for spec in specs]


def _budget(budget: int | None, options: StepOptions, measured: bool) -> tuple[int, str]:
    """The budget given, else the simulated GPU's capacity when ``--gpu`` names one and
    peaks are estimated, else the CUDA device's free memory."""
    if budget is not None:
        return int(budget), "given"
    device = options.device
    spec = target_spec(options.gpu) if options.target == "cuda" and not measured else None
    if spec is not None and spec.total_memory != UNBOUNDED:
        return spec.capacity, f"simulated: {capacity_text(spec)}"
    if device.is_cuda and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(str(device))
        return int(free), f"free memory of {device} (torch.cuda.mem_get_info)"
    raise UsageError("no CUDA device here to read free memory from: give a budget (for example 8GiB)")


class _CudaPeaks:
    """A :data:`PeakMeter` on the CUDA allocator: the peak bytes ``stat`` (``"allocated"``
    or ``"reserved"``) while a probe runs, above the bytes held when the first probe began.
    One base for every probe, so each counts what a fresh run of the step needs: the
    cuBLAS workspaces the first probe creates stay allocated, and would otherwise count in
    that probe only. For ``"reserved"`` the allocator's cache is emptied before each
    probe: the segments an earlier probe left cached would serve this one, and its
    reserved peak would read as nothing. Each probe resets the peak statistics."""

    def __init__(self, stat: str = "allocated") -> None:
        self.stat = stat
        self.base: int | None = None

    def __call__(self, run: Callable[[], Any], device: Device) -> int | None:
        if not device.is_cuda:
            raise UsageError(f"measured peaks need a CUDA device, not {str(device)!r}")
        if not torch.cuda.is_available():
            raise UsageError("measured peaks need CUDA, and no CUDA device is available here")
        dev = torch.device(str(device))
        gc.collect()
        torch.cuda.synchronize(dev)
        reserved = self.stat == "reserved"
        if reserved:
            torch.cuda.empty_cache()
        current, peak = (
            (torch.cuda.memory_reserved, torch.cuda.max_memory_reserved)
            if reserved
            else (torch.cuda.memory_allocated, torch.cuda.max_memory_allocated)
        )
        if self.base is None:
            self.base = current(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        try:
            run()
            torch.cuda.synchronize(dev)
        except torch.cuda.OutOfMemoryError:
            return None
        finally:
            gc.collect()
        return peak(dev) - self.base


def _measured_peaks(
    model: Any,
    specs: list[InputSpec],
    options: StepOptions,
    read: PeakMeter,
    user: tuple[StepFunction | None, Callable[[Any], torch.Tensor]] = (None, default_loss),
) -> PeakFunction:
    """Peaks of real steps read by ``read``; ``user`` is the user's step (None: the
    built-in one) and the loss function."""
    device = str(options.device)
    model_step, loss_fn = user

    def run(batch: int) -> None:
        # A fresh copy per probe: every peak counts the parameters alike, the caller's
        # module stays as it was.
        module = (
            copy.deepcopy(model).to(device)
            if isinstance(model, torch.nn.Module)
            else build_model(model, device)
        )
        cast = options.torch_dtype
        if cast is not None:
            module = module.to(cast)
        module.train(options.training)
        batched = _rebatch(specs, batch)
        tensors = make_inputs(batched, device, cast)
        params = [p for p in module.parameters() if p.requires_grad]
        if model_step is not None:
            opt = make_optimizer(options.optimizer, params, options.target)
            run_user_steps(model_step, module, opt, tensors)
            return
        args, kwargs = split_named(batched, tensors)
        opt = make_optimizer(options.optimizer, params, options.target) if options.training else None
        amp = options.amp_dtype
        steps = {"autocast": lambda: torch.autocast(options.target, dtype=amp)} if amp is not None else {}
        run_steps(
            lambda: module(*args, **kwargs),
            params,
            opt,
            training=options.training,
            loss_fn=loss_fn,
            **steps,
        )

    return lambda batch: read(lambda: run(batch), options.device)
