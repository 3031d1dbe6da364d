"""The options of one simulated or measured step, parsed once: :class:`StepOptions`.

Torch-free: dtypes are kept by name and turned into ``torch.dtype`` lazily, so the CLI
can parse (and reject) options before torch is imported. The one rule for the dtype a
model is cast to (floating only), :func:`cast_dtype_name`, lives here;
:func:`~gpu_mem_track.estimator.specs.parse_cast_dtype` returns its ``torch.dtype``. The
CUDA target's memory options are kept as given: the simulation turns them into its
:mod:`~gpu_mem_track.estimator.target` simulated GPU (which reads the environment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..devices import Device, parse_device
from ..dtypes import DTYPE_ALIASES, canonical_dtype, dtype_name, torch_dtype
from ..errors import UsageError
from .records import OPTIMIZERS

__all__ = ["AMP_DTYPES", "CAST_DTYPES", "STRATEGIES", "DistOptions", "StepOptions", "cast_dtype_name"]

#: The dtypes autocast may run in.
AMP_DTYPES = ("float16", "bfloat16")

#: The dtypes a model may be cast to (``dtype=``, ``--dtype``): it trains in these.
CAST_DTYPES = ("float32", "float16", "bfloat16", "float64")

#: How the step is spread over ranks: ``none`` (one process), ``ddp``
#: (DistributedDataParallel), ``zero1`` (DDP plus optimizer state sharded, as with
#: ZeroRedundancyOptimizer), ``zero2`` (plus gradients sharded), ``fsdp`` (FSDP2).
STRATEGIES = ("none", "ddp", "zero1", "zero2", "fsdp")


@dataclass(frozen=True)
class DistOptions:
    """How one step runs on ``world_size`` ranks (see ``estimator.distributed``).

    ``strategy``: one of ``STRATEGIES``. ``bucket_cap_mb`` (MiB): DDP's bucket size,
    ``None`` for torch's default (25 MiB, and a 1 MiB first bucket; an explicit cap
    applies to the first bucket too). ``gradient_as_bucket_view``: DDP's option (the
    gradients are views into the buckets). ``fsdp_units``: module-name patterns
    (``fnmatch``) of the modules given their own ``fully_shard``; empty for every
    direct child with parameters; the root is always one. ``reshard_after_forward``:
    FSDP2's option (True: unsharded parameters are freed after each unit's forward
    and gathered again in backward).
    """

    world_size: int = 1
    strategy: str = "none"
    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool = False
    fsdp_units: tuple[str, ...] = ()
    reshard_after_forward: bool = True

    @classmethod
    def parse(
        cls,
        *,
        world_size: Any = 1,
        strategy: Any = None,
        bucket_cap_mb: Any = None,
        gradient_as_bucket_view: bool = False,
        fsdp_units: Any = (),
        reshard_after_forward: bool = True,
    ) -> DistOptions:
        """Options as typed; ``UsageError`` naming a bad value. ``strategy`` defaults to
        ``ddp`` when ``world_size`` is over 1, else ``none``."""
        try:
            size = int(world_size)
        except (TypeError, ValueError):
            raise UsageError(f"world size must be a whole number, not {world_size!r}") from None
        if size < 1:
            raise UsageError(f"world size must be at least 1, not {size}")
        name = (strategy or ("ddp" if size > 1 else "none")).lower()
        if name not in STRATEGIES:
            raise UsageError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
        if bucket_cap_mb is not None and not float(bucket_cap_mb) > 0:
            raise UsageError(f"bucket_cap_mb must be positive, not {bucket_cap_mb!r}")
        units = (fsdp_units,) if isinstance(fsdp_units, str) else tuple(fsdp_units or ())
        return cls(
            world_size=size,
            strategy=name,
            bucket_cap_mb=None if bucket_cap_mb is None else float(bucket_cap_mb),
            gradient_as_bucket_view=bool(gradient_as_bucket_view),
            fsdp_units=units,
            reshard_after_forward=bool(reshard_after_forward),
        )


@dataclass(frozen=True)
class StepOptions:
    """What one step runs with.

    ``dtype``: torch name of the floating dtype the model's floating parameters, buffers
    and inputs are cast to (``"bfloat16"``), ``None`` to keep them as built. ``amp``: autocast's dtype name
    (``"float16"`` or ``"bfloat16"``), ``None`` without autocast. ``optimizer``: one of
    ``OPTIMIZERS`` or a callable ``params -> Optimizer``. ``training``: a training step
    (forward, loss, backward, optimizer step) or, when False, one forward pass under
    ``no_grad``. ``device``: the CPU or a CUDA device. ``warmup``: steps run before the
    measured one (None: 1 for training or a user's step, so the optimizer state exists;
    0 for inference). The CUDA target's memory model (a ``UsageError`` on the CPU target; None:
    the environment variables, see
    :mod:`~gpu_mem_track.estimator.target`): ``alloc_conf``, a
    ``PYTORCH_CUDA_ALLOC_CONF`` value; ``gpu``, the simulated GPU (an architecture or a
    GPU of the catalog); ``cublas_workspace``, bytes or a ``CUBLAS_WORKSPACE_CONFIG`` value.
    ``distributed``: the ranks and strategy (:class:`DistOptions`; one process by
    default).
    """

    dtype: str | None = None
    amp: str | None = None
    optimizer: str | Callable[..., Any] = "adam"
    training: bool = True
    device: Device = Device("cuda")
    warmup: int | None = None
    alloc_conf: str | None = None
    gpu: str | None = None
    cublas_workspace: int | str | None = None
    distributed: DistOptions = DistOptions()

    @classmethod
    def parse(
        cls,
        *,
        dtype: Any = None,
        amp: Any = False,
        optimizer: Any = "adam",
        training: bool = True,
        device: Any = "cuda",
        warmup: int | None = None,
        alloc_conf: str | None = None,
        gpu: str | None = None,
        cublas_workspace: int | str | None = None,
        distributed: DistOptions | None = None,
    ) -> StepOptions:
        """Options from what users type or pass: ``dtype`` a floating alias (``"bf16"``),
        a floating ``torch.dtype`` or None (integer and bool dtypes are refused); ``amp``
        False/None, True (float16), an alias or a dtype; ``optimizer`` a name (case
        ignored) or a callable; ``device`` anything
        :func:`~gpu_mem_track.devices.parse_device` takes; ``warmup`` a count >= 0 or None;
        ``alloc_conf``, ``gpu`` and ``cublas_workspace`` are kept as given (checked when
        the CUDA target's memory model is built); ``distributed`` a :class:`DistOptions`
        or None (one process). Raises ``UsageError`` naming the bad value."""
        dtype = None if dtype is None else cast_dtype_name(dtype)
        amp, optimizer = _amp_name(amp), _optimizer(optimizer)
        device = parse_device(device)
        if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0):
            raise UsageError(f"warmup must be a count of steps >= 0, not {warmup}")
        memory = (alloc_conf, gpu, cublas_workspace)
        return cls(
            dtype, amp, optimizer, bool(training), device, warmup, *memory, distributed or DistOptions()
        )

    @property
    def target(self) -> str:
        """The device type the step targets: ``"cuda"`` or ``"cpu"``."""
        return self.device.type

    @property
    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` of ``dtype`` (None when the model keeps its dtypes)."""
        return None if self.dtype is None else torch_dtype(self.dtype)

    @property
    def amp_dtype(self) -> Any:
        """Autocast's ``torch.dtype`` (None without autocast)."""
        return None if self.amp is None else torch_dtype(self.amp)

    @property
    def optimizer_name(self) -> str:
        """The optimizer's name, or a callable's ``__name__`` (``"custom"`` without one)."""
        if isinstance(self.optimizer, str):
            return self.optimizer
        return getattr(self.optimizer, "__name__", "custom")


def cast_dtype_name(dtype: Any) -> str:
    """The torch name of the floating dtype to cast a model to, from an alias (``"bf16"``,
    case ignored) or a ``torch.dtype``. Integer and bool dtypes are refused (``UsageError``):
    a model cast to them cannot train (its floating parameters would be truncated and
    autograd needs floating tensors)."""
    choices = "float32, float16, bfloat16 or float64 (also fp32, fp16, half, bf16, fp64)"
    is_dtype = type(dtype).__name__ == "dtype" and str(dtype).startswith("torch.")
    name = DTYPE_ALIASES.get(dtype.lower()) if isinstance(dtype, str) else None
    if is_dtype:
        name = dtype_name(dtype)
    if name is None:
        raise UsageError(f"unknown dtype {dtype!r} for the model: choose {choices}")
    if not (dtype.is_floating_point if is_dtype else name in CAST_DTYPES):
        raise UsageError(
            f"cannot cast the model to {name}: a model trains in {choices}; "
            "integer inputs are given as SHAPE:int64"
        )
    return name


def _optimizer(optimizer: Any) -> str | Callable[..., Any]:
    """A known optimizer name (lower case), ``"none"`` for None, or the callable itself."""
    if optimizer is None:
        return "none"
    if isinstance(optimizer, str):
        if optimizer.lower() not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer {optimizer.lower()!r} (choose from {', '.join(OPTIMIZERS)})")
        return optimizer.lower()
    if not callable(optimizer):
        raise UsageError(f"optimizer must be a name or a callable, not {optimizer!r}")
    return optimizer


def _amp_name(amp: Any) -> str | None:
    if amp is False or amp is None:
        return None
    name = "float16" if amp is True else canonical_dtype(amp)
    if name not in AMP_DTYPES:
        raise UsageError(f"autocast runs in float16 or bfloat16, not {name}")
    return name
