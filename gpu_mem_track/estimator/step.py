"""One training or inference step, the same for the estimator and for real measurements.

The step is: ``zero_grad(set_to_none=True)``, forward, loss, backward, optimizer step.
Helpers here build the model, its inputs and its optimizer on a given device; callers
observe the step through ``on_phase(phase, step_index)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Union

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ..dtypes import dtype_name
from ..errors import UsageError
from .options import StepOptions
from .records import OPTIMIZERS
from .specs import InputSpec, callable_name, parse_input

__all__ = [
    "OPTIMIZERS",
    "FactoryError",
    "StepError",
    "InputsLike",
    "StepFunction",
    "build_model",
    "default_loss",
    "make_inputs",
    "check_user_step",
    "make_optimizer",
    "run_steps",
    "run_user_steps",
    "split_named",
]

#: Optimizer names: Adam/AdamW keep exp_avg and exp_avg_sq per parameter (and a ``step``
#: tensor); SGD uses momentum 0.9 (one buffer per parameter); "none" skips the step.

OptimizerLike = Union[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer], None]
InputsLike = Union[torch.Tensor, InputSpec, str, Sequence[int], Sequence[Any]]
#: A user's step: ``step(model, optimizer, inputs)`` (optimizer None without one; inputs
#: the list of input tensors); what it returns stays alive until its next call returns.
StepFunction = Callable[[nn.Module, Union[torch.optim.Optimizer, None], list], Any]


class FactoryError(UsageError):
    """The model factory raised or returned something that is not an ``nn.Module``."""


class StepError(UsageError):
    """The model's own code raised during the step: its forward, the loss, backward
    through it or the optimizer's step. ``__cause__`` is the exception it raised."""


@contextlib.contextmanager
def _model_code() -> Iterator[None]:
    """Report what the model's code raises as a ``StepError``. Out-of-memory errors pass
    unchanged (a measured step that runs out of memory does not fit), and so does our
    own ``UsageError``."""
    try:
        yield
    except (UsageError, MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StepError(f"the model's step failed: {type(exc).__name__}: {first}") from exc


def build_model(factory: Callable[[], Any], device: str) -> nn.Module:
    """Call ``factory()`` with ``device`` as the default device; the module it returns."""
    name = callable_name(factory)
    try:
        with torch.device(device):
            module = factory()
    except Exception as exc:
        raise FactoryError(f"calling the factory {name} failed with {type(exc).__name__}: {exc}") from exc
    if not isinstance(module, nn.Module):
        raise FactoryError(f"the factory {name} returned {type(module).__name__}, not an nn.Module")
    return module


def as_specs(inputs: InputsLike) -> list[InputSpec | torch.Tensor]:
    """Normalise ``inputs``: a tensor, an :class:`InputSpec`, a shape, the shape text the
    command line takes (``"64x256"``, ``"32x128:int64"``, ``"labels=32x128:int64"``; see
    :func:`~gpu_mem_track.estimator.specs.parse_input`), or a sequence of those."""
    if isinstance(inputs, (torch.Tensor, InputSpec)):
        return [inputs]
    if isinstance(inputs, str):
        return [parse_input(inputs)]
    items = list(inputs)
    if items and all(isinstance(size, int) for size in items):
        return [InputSpec(tuple(items))]
    specs: list[InputSpec | torch.Tensor] = []
    for item in items:
        if isinstance(item, (torch.Tensor, InputSpec)):
            specs.append(item)
        elif isinstance(item, (tuple, list)) and item and all(isinstance(s, int) for s in item):
            specs.append(InputSpec(tuple(item)))
        elif isinstance(item, str):
            specs.append(parse_input(item))
        else:
            raise UsageError(f"not an input: {item!r} (give a tensor, a shape, its text or an InputSpec)")
    if not specs:
        raise UsageError("no inputs given")
    return specs


def make_inputs(
    specs: Iterable[InputSpec | torch.Tensor], device: str, dtype: torch.dtype | None
) -> list[torch.Tensor]:
    """Input tensors on ``device``; floating ones cast to ``dtype`` when given.

    Shapes become random floats, and integer or bool tensors of ones: token id 1 (valid
    in any vocabulary of two or more), labels 1, an attention mask with no padding, True.
    On the meta device the estimator's :class:`~gpu_mem_track.dispatch.values.KnownValues`
    keeps these values beside the data-less tensors.
    """
    tensors = []
    for spec in specs:
        if isinstance(spec, torch.Tensor):
            tensor = spec.detach().to(device)
        elif spec.dtype.is_floating_point:
            tensor = torch.randn(spec.shape, dtype=spec.dtype, device=device)
        else:
            tensor = torch.ones(spec.shape, dtype=spec.dtype, device=device)
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors.append(tensor)
    return tensors


def split_named(
    specs: Sequence[InputSpec | torch.Tensor], tensors: Sequence[torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """``(args, kwargs)`` for the model: inputs whose spec has a ``name`` go by keyword."""
    args, kwargs = [], {}
    for spec, tensor in zip(specs, tensors):
        name = spec.name if isinstance(spec, InputSpec) else ""
        if name in kwargs:
            raise UsageError(f"the input {name}= is given twice")
        if name:
            kwargs[name] = tensor
        else:
            args.append(tensor)
    return tuple(args), kwargs


def describe(tensor: torch.Tensor, name: str = "") -> str:
    """``"64x3x32x32"``, with ``":dtype"`` unless float32 and ``"name="`` for a keyword input."""
    return (
        str(InputSpec(tuple(tensor.shape), tensor.dtype, name))
        if tensor.dim()
        else f"{name + '=' if name else ''}scalar:{dtype_name(tensor.dtype)}"
    )


def make_optimizer(
    choice: OptimizerLike, params: list[nn.Parameter], target: str
) -> torch.optim.Optimizer | None:
    """The optimizer named by ``choice`` (see ``OPTIMIZERS``) or made by calling it.

    Named optimizers use the implementation torch picks by default on the ``target``
    device type: ``foreach`` on CUDA, the per-tensor loop on the CPU.
    """
    if choice is None or choice == "none":
        return None
    if callable(choice):
        return choice(params)
    foreach = target == "cuda"
    if choice == "adam":
        return torch.optim.Adam(params, foreach=foreach)
    if choice == "adamw":
        return torch.optim.AdamW(params, foreach=foreach)
    if choice == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=foreach)
    raise UsageError(f"unknown optimizer {choice!r} (choose from {', '.join(OPTIMIZERS)})")


def default_loss(output: Any) -> torch.Tensor:
    """The model's own loss when its output carries one, else the sum of its outputs.

    An output with a tensor ``loss`` (an attribute or a mapping key: Hugging Face models
    given ``labels=``) is that loss; otherwise the loss is the sum of every floating-point
    tensor in the output, at any nesting (tuples, lists, dicts, ``ModelOutput``).
    """
    own = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(own, torch.Tensor) and own.is_floating_point():
        return own
    tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise UsageError("the model's output holds no floating-point tensor to take a loss of")
    loss = tensors[0].sum()
    for tensor in tensors[1:]:
        loss = loss + tensor.sum()
    return loss


def run_steps(
    forward: Callable[[], Any],
    params: list[nn.Parameter],
    optimizer: torch.optim.Optimizer | None,
    *,
    training: bool = True,
    steps: int = 2,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    on_phase: Callable[[str, int], None] = lambda phase, step: None,
) -> None:
    """Run ``steps`` identical steps, calling ``on_phase(phase, step)`` as each phase starts.

    Phases: ``"step start"`` (gradients set to ``None``), ``"forward"``, ``"loss"``,
    ``"backward"``, ``"optimizer step"`` and, after the last step, ``"done"``. Forward
    and loss run under ``autocast()``. Without ``training`` each step is a forward pass
    under ``torch.no_grad()``: ``"step start"``, ``"forward"``, ``"forward end"`` (the
    output still alive), then ``"done"``.
    Nothing of the step outlives it except gradients and optimizer state. What the
    model's code raises (forward, loss, backward, optimizer step) is a ``StepError``.
    """
    for step in range(steps):
        on_phase("step start", step)
        if not training:
            on_phase("forward", step)
            with torch.no_grad(), autocast():
                with _model_code():
                    output = forward()
            on_phase("forward end", step)
            del output
            continue
        for param in params:
            param.grad = None
        on_phase("forward", step)
        with autocast():
            with _model_code():
                output = forward()
            on_phase("loss", step)
            with _model_code():
                loss = loss_fn(output)
        del output
        on_phase("backward", step)
        with _model_code():
            loss.backward()
        del loss
        if optimizer is not None:
            on_phase("optimizer step", step)
            with _model_code():
                optimizer.step()
    on_phase("done", steps - 1)


def run_user_steps(
    step: StepFunction,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    inputs: list[torch.Tensor],
    *,
    steps: int = 2,
    on_phase: Callable[[str, int], None] = lambda phase, step: None,
) -> None:
    """Call ``step(model, optimizer, inputs)`` ``steps`` times, with ``on_phase("step start",
    i)`` before each call and ``on_phase("done", steps - 1)`` after the last. What a call
    returns stays bound until the next call returns, as ``out = step(...)`` in a loop
    would keep it; what the step raises is a ``StepError``."""
    kept = None
    for index in range(steps):
        on_phase("step start", index)
        with _model_code():
            kept = step(model, optimizer, inputs)
    del kept
    on_phase("done", steps - 1)


def check_user_step(options: StepOptions, loss_fn: Callable[[Any], Any]) -> None:
    """A user's step computes its own loss and runs its own autocast: a ``loss_fn`` other
    than the default, or ``amp``, given with one is a ``UsageError``. So is a distributed
    strategy: the estimator adds a strategy's storages around its built-in step only."""
    if loss_fn is not default_loss:
        raise UsageError(
            f"the loss {callable_name(loss_fn)} (--loss, loss_fn) does not apply to a custom step "
            "(--step, step=): the step computes its own loss"
        )
    if options.amp is not None:
        raise UsageError(
            "autocast (--amp, amp) does not apply to a custom step (--step, step=): "
            "run torch.autocast inside the step"
        )
    dist = options.distributed
    if dist.strategy != "none":
        ranks = f"{dist.world_size} rank{'s' if dist.world_size != 1 else ''}"
        raise UsageError(
            f"a custom step (--step, step=) cannot be estimated with --strategy {dist.strategy} "
            f"over {ranks}: the strategy's buckets, shards and gathers are added around the "
            "built-in step only; drop --step, or estimate the step as one process"
        )
