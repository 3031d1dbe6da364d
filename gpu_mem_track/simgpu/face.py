"""The face simulated tensors show to Python: they live on the ``meta`` device (shapes,
dtypes, storages, no data) and say they are on ``cuda:0``.

:class:`CudaFace` is a torch-function mode. It rewrites CUDA device arguments to
``meta`` (``device="cuda"``, ``device=0``, ``.cuda()``, ``.to("cuda")``, ``.to(0)``),
answers ``.device``, ``.is_cuda``, ``.is_meta``, ``.is_cpu`` and ``get_device()`` for
meta tensors as a CUDA tensor would, turns ``.cpu()``/``.numpy()``/``.tolist()``/
``print``/``repr`` into reads of a CPU copy (its value when known, else a placeholder:
see :mod:`~gpu_mem_track.dispatch.values`), answers ``isfinite``/``isnan``/``isinf`` of
unknown values as finite (:data:`FINITE_CHECKS`), makes ``record_stream`` on them a
no-op, and applies CUDA's behaviour where the CPU's differs: autocast with CUDA's op
lists when ``torch.autocast("cuda")`` is on (:mod:`~gpu_mem_track.gpumodel.autocast`)
the attention backend CUDA would pick (:mod:`~gpu_mem_track.gpumodel.attention`),
dropout's fused kernel with its one-byte mask (:mod:`~gpu_mem_track.gpumodel.dropout`) and
linear-shaped einsums as linear layers, whose weight gradients come in the weight's
layout as on the GPU (:mod:`~gpu_mem_track.gpumodel.einsum`).
Large CPU tensors made while a module is built are virtual
(:mod:`~gpu_mem_track.simgpu.virtual`): the face says ``cpu`` for them. The program's own
meta tensors (:mod:`~gpu_mem_track.simgpu.usermeta`) say ``meta`` and refuse ``.to("cuda")``
as on a GPU; a call with a ``meta`` device argument from outside this package makes them.

Real CPU tensors pass through untouched (the data pipeline stays real). The mode only
sees calls made from Python at the torch API level; calls that a torch function makes
internally are not seen (autograd's and the optimizers' aten ops are seen by the
dispatch side, :class:`~gpu_mem_track.simgpu.engine.Storages`), except inside
``F.multi_head_attention_forward``, which runs with the mode re-entered so its attention
call is seen.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from ..gpumodel.attention import cuda_attention
from ..gpumodel.autocast import CudaAutocast
from ..gpumodel.dropout import DROPOUTS, cuda_dropout
from ..gpumodel.einsum import as_linear
from .legacy import cuda_type_dtype, cuda_type_name
from .usermeta import MetaTensors, called_from_us, is_meta_device
from .virtual import FACTORIES, VirtualCpu, default_device

__all__ = ["CUDA0", "FINITE_CHECKS", "META", "CudaFace", "is_cuda_device"]

META = torch.device("meta")
CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")
_Handler = Callable[[Any, tuple, dict], Any]


#: Checks for inf and NaN on simulated values: answered as finite (as GradScaler's
#: found_inf is), so ``if not torch.isfinite(loss): skip`` goes the usual way.
FINITE_CHECKS = {
    **{f: True for f in (torch.isfinite, torch.Tensor.isfinite)},
    **{f: False for f in (torch.isnan, torch.Tensor.isnan, torch.isinf, torch.Tensor.isinf)},
    **{f: False for f in (torch.isposinf, torch.Tensor.isposinf, torch.isneginf, torch.Tensor.isneginf)},
}


def is_cuda_device(value: Any) -> bool:
    """Whether a device argument names CUDA (``"cuda"``, ``"cuda:0"``, a cuda
    ``torch.device``, or an int ordinal)."""
    if isinstance(value, str):
        return value.startswith("cuda")
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, int) and not isinstance(value, bool)


def _operands(args: tuple) -> list:
    """einsum's operands, given one by one or as one list."""
    return list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)


def _meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


class CudaFace(TorchFunctionMode):
    """See the module doc. ``autocast`` holds the casts of the running autocast region."""

    def __init__(
        self,
        virtual: VirtualCpu | None = None,
        assume: Callable[[Any, Any], None] | None = None,
        meta: MetaTensors | None = None,
    ):
        super().__init__()
        self.assume = assume
        self.constructors = _device_constructors()
        self.autocast = CudaAutocast()
        self.virtual = virtual if virtual is not None else VirtualCpu()
        self.meta = meta if meta is not None else MetaTensors()
        gpu = self._on_gpu
        cpu = self.virtual.holds
        self.handlers: dict[Any, _Handler] = {
            torch.Tensor.device.__get__: self._device,
            torch.Tensor.is_cuda.__get__: lambda f, a, k: gpu(a[0]) if _meta(a[0]) else f(*a, **k),
            torch.Tensor.is_meta.__get__: lambda f, a, k: f(*a, **k) and self.meta.holds(a[0]),
            torch.Tensor.is_cpu.__get__: lambda f, a, k: cpu(a[0]) if _meta(a[0]) else f(*a, **k),
            torch.Tensor.get_device: lambda f, a, k: (0 if gpu(a[0]) else -1) if _meta(a[0]) else f(*a, **k),
            torch.Tensor.to: self._to,
            torch.Tensor.cuda: self._cuda,
            torch.Tensor.cpu: lambda f, a, k: a[0].to("cpu") if _meta(a[0]) else f(*a, **k),
            torch.Tensor.numpy: self._via_cpu,
            torch.Tensor.tolist: self._via_cpu,
            torch.Tensor.__repr__: self._repr,
            torch.Tensor.__format__: self._format,
            torch.Tensor.pin_memory: lambda f, a, k: (
                a[0] if _meta(a[0]) or a[0].device.type == "cpu" else f(*a, **k)
            ),
            torch.Tensor.is_pinned: lambda f, a, k: False if _meta(a[0]) else f(*a, **k),
            torch.Tensor.record_stream: lambda f, a, k: None,
            torch.Tensor.type: self._type,
            F.scaled_dot_product_attention: self._attention,
            torch.einsum: self._einsum,
            **{check: self._finite for check in FINITE_CHECKS},
            F.multi_head_attention_forward: self._reentered,
            torch.Tensor.backward: self._backward,
            torch.autograd.backward: self._reentered,
            torch.autograd.grad: self._reentered,
            torch.tensor: self._from_data,
            torch.as_tensor: self._from_data,
            torch.asarray: self._from_data,
            torch.Tensor.new_tensor: self._new_tensor,
            **{dropout: self._dropout for dropout in DROPOUTS},
        }

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        handler = self.handlers.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        if func in self.constructors and kwargs.get("device") is None:
            current = _current_device()
            if is_cuda_device(current):  # torch.set_default_device("cuda"), applied below us
                kwargs = {**kwargs, "device": current}  # made on the simulated GPU below
            elif is_meta_device(current) and not called_from_us(1):  # with torch.device("meta")
                return self.meta.run(True, self._run, (func, args, kwargs), {})
        if func in FACTORIES and self.virtual.wanted(func, args, kwargs):
            return self._make_virtual(func, args, kwargs)
        if "device" in kwargs and is_cuda_device(kwargs["device"]):
            kwargs = {**kwargs, "device": META}
            return self.meta.run(False, self._run, (func, args, kwargs), {})
        if "device" in kwargs and is_meta_device(kwargs["device"]) and not called_from_us(1):
            return self.meta.run(True, self._run, (func, args, kwargs), {})
        return self._run(func, args, kwargs)

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``func`` as CUDA runs it: under CUDA autocast's casts when autocast is on."""
        if torch.is_autocast_enabled("cuda"):
            return self.autocast.call(func, args, kwargs, torch.get_autocast_dtype("cuda"))
        return func(*args, **kwargs)

    def _dropout(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return cuda_dropout(func, args, kwargs, self._on_gpu)

    def _einsum(self, func: Any, args: tuple, kwargs: dict) -> Any:
        plan = as_linear(args[0], args[1:]) if args and not kwargs else None
        if plan is None or not any(_meta(t) for t in _operands(args[1:])):
            return self._run(func, args, kwargs)
        return self._run(plan[0], plan[1], {})

    def _on_gpu(self, tensor: torch.Tensor) -> bool:
        """A meta tensor is on the simulated GPU unless it is virtual CPU or the program's
        own meta tensor (:mod:`~gpu_mem_track.simgpu.usermeta`)."""
        return not self.virtual.holds(tensor) and not self.meta.holds(tensor)

    def _device(self, func: Any, args: tuple, kwargs: dict) -> Any:
        device = func(*args, **kwargs)
        if device.type != "meta" or self.meta.holds(args[0]) or isinstance(args[0], FakeTensor):
            return device  # a fake tensor (DTensor's sharding propagation) is not simulated
        return CUDA0 if self._on_gpu(args[0]) else CPU

    def _make_virtual(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        self.virtual.making = True
        try:
            out = func(*args, **{**kwargs, "device": META})
        finally:
            self.virtual.making = False
        self.virtual.add(out)
        return out

    def _to(self, func: Any, args: tuple, kwargs: dict) -> Any:
        moved = [META if is_cuda_device(a) and not isinstance(a, torch.dtype) else a for a in args[1:]]
        to_gpu = "device" in kwargs and is_cuda_device(kwargs["device"])
        to_meta = any(is_meta_device(a) for a in (*args[1:], kwargs.get("device")))  # as asked
        if to_gpu:
            kwargs = {**kwargs, "device": META}
        source = args[0]
        if (to_gpu or META in moved) and _meta(source) and self.virtual.holds(source):
            dtype = kwargs.get("dtype") or next(
                (a for a in moved if isinstance(a, torch.dtype)), source.dtype
            )
            return _fresh(source, dtype)
        if _meta(source) and self.meta.holds(source):
            if to_gpu or any(map(is_cuda_device, args[1:])) or _names_cpu(args[1:], kwargs):
                raise NotImplementedError("Cannot copy out of meta tensor; no data!")  # as torch
            return func(source, *moved, **kwargs)
        if to_meta and not called_from_us(2):  # the program's own meta copy (a CPU tensor's)
            return self.meta.run(True, func, (source, *moved), kwargs)
        return func(source, *moved, **kwargs)

    def _type(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``Tensor.type`` as on a GPU: the ``torch.cuda`` type name of a simulated tensor,
        and a legacy CUDA type (``torch.cuda.HalfTensor``) as a move to the GPU."""
        given = args[1] if len(args) > 1 else kwargs.get("dtype")
        dtype = cuda_type_dtype(given)
        if dtype is not None:
            non_blocking = bool(args[2]) if len(args) > 2 else kwargs.get("non_blocking", False)
            move = {"device": "cuda", "dtype": dtype, "non_blocking": non_blocking}
            return self._to(torch.Tensor.to, args[:1], move)
        out = func(*args, **kwargs)
        if given is None and _meta(args[0]) and self._on_gpu(args[0]):
            return cuda_type_name(out)
        return out

    def _cuda(self, func: Any, args: tuple, kwargs: dict) -> Any:
        source = args[0]
        if _meta(source) and self.virtual.holds(source):
            return _fresh(source, source.dtype)
        if _meta(source) and self.meta.holds(source):
            raise NotImplementedError("Cannot copy out of meta tensor; no data!")  # as torch
        memory_format = kwargs.get("memory_format", torch.preserve_format)
        return source.to(META, memory_format=memory_format)

    def _from_data(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``torch.tensor``/``as_tensor``/``asarray`` onto CUDA: torch makes these on the
        meta device in C++ without an op a dispatch mode sees (no storage would be counted),
        so the tensor is made on the CPU and copied (one ``_to_copy``, counted, its value
        known)."""
        if not is_cuda_device(kwargs.get("device")) or (args and _meta(args[0])):
            if is_cuda_device(kwargs.get("device")):
                kwargs = {**kwargs, "device": META}
            return func(*args, **kwargs)
        requires_grad = kwargs.get("requires_grad", False)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("requires_grad", "pin_memory")}
        out = func(*args, **{**kwargs, "device": "cpu"}).to(META)
        return out.requires_grad_() if requires_grad else out

    def _new_tensor(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``t.new_tensor(data)`` of a simulated ``t`` (or onto CUDA): as ``torch.tensor``."""
        device = kwargs.get("device")
        if device is None and _meta(args[0]) and self._on_gpu(args[0]):
            device = CUDA0
        if not is_cuda_device(device):
            return func(*args, **kwargs)
        dtype = kwargs.get("dtype") or args[0].dtype
        options = {**kwargs, "dtype": dtype, "device": device}
        return self._from_data(torch.tensor, args[1:], options)

    def _via_cpu(self, func: Any, args: tuple, kwargs: dict) -> Any:
        first = args[0]
        return func(first.to("cpu") if _meta(first) else first, *args[1:], **kwargs)

    def _repr(self, func: Any, args: tuple, kwargs: dict) -> str:
        tensor = args[0]
        if not _meta(tensor) or self.meta.holds(tensor):
            return func(*args, **kwargs)
        return cuda_repr(tensor, tensor.detach().to("cpu"), on_gpu=self._on_gpu(tensor))

    def _finite(self, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        if self.assume is not None and _meta(out) and _meta(args[0]):
            self.assume(out, FINITE_CHECKS[func])
        return out

    def _format(self, func: Any, args: tuple, kwargs: dict) -> str:
        tensor, spec = args[0], args[1]
        if not _meta(tensor) or self.meta.holds(tensor):
            return func(*args, **kwargs)
        if tensor.dim() == 0:
            return tensor.detach().item().__format__(spec)
        return format(self._repr(torch.Tensor.__repr__, (tensor,), {}), spec)

    def _attention(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if torch.is_autocast_enabled("cuda"):
            args, kwargs = self.autocast.cast_for(func, args, kwargs, torch.get_autocast_dtype("cuda"))
        if not _meta(args[0]):
            return func(*args, **kwargs)
        return cuda_attention(func, args, kwargs, self.capability)

    def _reentered(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``func`` (``F.multi_head_attention_forward``, ``torch.autograd.backward`` or
        ``grad``) with this mode on, so the calls it makes are seen: the attention inside
        the first, what backward runs in Python (checkpointed forwards recomputed, hooks,
        custom functions' backward) inside the others. Its own first
        ``has_torch_function`` check answers False once: with the mode on it would hand
        the call back to this mode, without end."""
        module = sys.modules[func.__module__]
        original = module.has_torch_function

        def once(*tensors: Any) -> bool:
            module.has_torch_function = original
            return False

        module.has_torch_function = once
        try:
            with self:
                return func(*args, **kwargs)
        finally:
            module.has_torch_function = original

    def _backward(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``tensor.backward(...)`` as ``torch.autograd.backward`` with this mode on."""
        given = dict(zip(("gradient", "retain_graph", "create_graph", "inputs"), args[1:]), **kwargs)
        options = {
            "grad_tensors": given.get("gradient"),
            "retain_graph": given.get("retain_graph"),
            "create_graph": given.get("create_graph", False),
            "inputs": given.get("inputs"),
        }
        return self._reentered(torch.autograd.backward, (args[0],), options)

    #: The simulated GPU's compute capability (for the attention backend); set by the engine.
    capability: tuple[int, int] = (8, 0)


@contextmanager
def checkpoint_metadata() -> Iterator[None]:
    """``torch.utils.checkpoint`` compares each tensor saved in forward with its
    recomputation (shape, dtype, device). Forward saves inside an op, where the face is
    off (meta); recomputation is checked inside backward, which runs with the face on
    (``cuda``). While this is entered both are read without the face."""
    import torch.utils.checkpoint as checkpoint

    table = getattr(checkpoint, "_allowed_determinism_checks_to_fns", None)
    original = table.get("default") if isinstance(table, dict) else None
    if original is None:
        yield
        return

    def metadata(tensor: torch.Tensor) -> Any:
        with torch._C.DisableTorchFunction():
            return original(tensor)

    table["default"] = metadata
    try:
        yield
    finally:
        table["default"] = original


def _current_device() -> Any:
    """The device a ``torch.device(...)`` context or ``torch.set_default_device`` gives
    constructors (its mode sits at the bottom of the stack, so it applies below us)."""
    import torch.utils._device as device_context

    current = getattr(device_context, "CURRENT_DEVICE", None)
    return current if current is not None else default_device()


def _names_cpu(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to``'s arguments name the CPU."""
    for value in (*args, kwargs.get("device")):
        if (isinstance(value, str) and value.startswith("cpu")) or (
            isinstance(value, torch.device) and value.type == "cpu"
        ):
            return True
    return False


def _fresh(source: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A simulated GPU copy of the virtual CPU tensor ``source`` (values copied when known)."""
    with torch.no_grad():
        out = torch.empty_strided(source.shape, source.stride(), dtype=dtype, device=META)
        out.copy_(source)
    return out.requires_grad_(True) if source.requires_grad and source.is_leaf else out


def cuda_repr(tensor: torch.Tensor, cpu: torch.Tensor, on_gpu: bool = True) -> str:
    """``repr`` of a simulated tensor as torch prints a CUDA one (a CPU one when not
    ``on_gpu``), values from ``cpu``."""
    from torch import _tensor_str

    prefix = "tensor("
    indent = len(prefix)
    suffixes = ["device='cuda:0'"] if on_gpu else []
    if cpu.numel() == 0 and cpu.dim() != 1:
        suffixes.append(f"size={tuple(cpu.shape)}")
    default = torch.get_default_dtype()
    if cpu.dtype not in (default, torch.int64, torch.bool) or (cpu.numel() == 0 and cpu.dtype != default):
        suffixes.append(f"dtype={cpu.dtype}")
    if tensor.grad_fn is not None:
        suffixes.append(f"grad_fn=<{type(tensor.grad_fn).__name__}>")
    elif tensor.requires_grad:
        suffixes.append("requires_grad=True")
    with torch.no_grad():
        body = _tensor_str._tensor_str(cpu, indent) if cpu.numel() or cpu.dim() != 1 else "[]"
    return _tensor_str._add_suffixes(prefix + body, suffixes, indent, force_newline=False)
