"""Which cuDNN convolutions an aten convolution op runs, in CUDA's order: the torch side of
:mod:`~gpu_mem_track.gpumodel.cudnn`.

``aten.convolution`` runs one forward problem (a transposed convolution's forward is
cuDNN's backward-data problem); ``aten.convolution_backward`` runs the data gradient, then
the weight gradient, each when its ``output_mask`` entry asks for it, and then sums the
bias gradient without cuDNN (``convolution_backward`` in ``aten/src/ATen/native/Convolution.cpp``,
``cudnn_convolution_backward`` in ``ConvShared.cpp``). :func:`convolution_plan` pairs each
problem with the output tensor CUDA allocates just before it, so the caller can count
each output and then its workspace in that order.

cuDNN runs a convolution when the dtype is a floating one it supports and PyTorch's
backend selection picks it (:func:`~gpu_mem_track.gpumodel.convbackend.select_backend`,
``_select_conv_backend`` in ``Convolution.cpp``: it needs ``torch.backends.cudnn.enabled``,
and most depthwise convolutions run PyTorch's own kernel instead, with no workspace); the
key's flags follow PyTorch's (``ctx.deterministicCuDNN() || ctx.deterministicAlgorithms()``,
``allowTF32CuDNN()``); its layout is NHWC when the input or the weight is channels-last
(:func:`channels_last`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .convbackend import CUDNN_BACKENDS, ConvCall, select_backend
from .cudnn import ConvProblem

__all__ = ["CONVOLUTION_OPS", "backend", "channels_last", "convolution_plan", "cudnn_settings"]

_aten = torch.ops.aten
#: The aten ops that reach cuDNN's convolutions.
CONVOLUTION_OPS = frozenset({_aten.convolution.default, _aten.convolution_backward.default})
_CUDNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def cudnn_settings() -> tuple[bool, bool, bool]:
    """``(enabled, benchmark, empty_cache_after_benchmark)`` as torch holds them now."""
    cudnn = torch.backends.cudnn
    empty = getattr(torch._C, "_cudnn_get_conv_benchmark_empty_cache", None)
    return bool(cudnn.enabled), bool(cudnn.benchmark), bool(empty()) if empty is not None else True


def _flags(tensor: torch.Tensor, in_backward: bool) -> tuple:
    deterministic = torch.backends.cudnn.deterministic or torch.are_deterministic_algorithms_enabled()
    return (
        tuple(tensor.stride()),
        bool(deterministic),
        bool(torch.backends.cudnn.allow_tf32),
        "backward thread" if in_backward else "caller's thread",
    )


def channels_last(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether cuDNN runs the convolution of ``x`` and ``w`` in the NHWC (NDHWC) layout:
    when either is channels-last, as ``cudnn_conv_suggest_memory_format`` decides (never
    in float64: it keeps doubles contiguous)."""
    if torch.float64 in (x.dtype, w.dtype):
        return False
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}

    def last(t: torch.Tensor) -> bool:
        fmt = formats.get(t.dim())
        return fmt is not None and not t.is_contiguous() and t.is_contiguous(memory_format=fmt)

    return last(x) or last(w)


def _problem(
    kind: str, x: torch.Tensor, w: torch.Tensor, y: Sequence[int], geometry: Sequence[Any], in_backward: bool
) -> ConvProblem:
    stride, padding, dilation, groups = geometry
    return ConvProblem(
        kind,
        tuple(x.shape),
        tuple(w.shape),
        tuple(y),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        int(groups),
        x.element_size(),
        _flags(x, in_backward),
        channels_last(x, w),
    )


def backend(x: torch.Tensor, w: torch.Tensor, geometry: Sequence[Any], capability: tuple[int, int]) -> str:
    """The ``ConvBackend`` PyTorch picks for input ``x`` and weight ``w`` on a CUDA device
    of ``capability``, ``geometry`` being ``(stride, padding, dilation, transposed,
    output_padding, groups)`` as ``aten.convolution`` takes them (see
    :mod:`~gpu_mem_track.gpumodel.convbackend`)."""
    stride, padding, dilation, transposed, output_padding, groups = geometry
    call = ConvCall(
        tuple(x.shape),
        tuple(w.shape),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        bool(transposed),
        tuple(output_padding),
        int(groups),
        str(x.dtype).removeprefix("torch."),
        channels_last(x, w),
    )
    return select_backend(call, capability, cudnn_settings()[0])


def convolution_plan(
    func: Any, args: tuple, out: Any, in_backward: bool, capability: tuple[int, int]
) -> list[tuple[Any, ConvProblem]]:
    """``[(tensor allocated first or None, problem), ...]`` for the op ``func`` called
    with ``args`` that returned ``out`` on a device of compute ``capability``; empty when
    cuDNN would not run (disabled, an unsupported dtype, an empty tensor, a backend other
    than cuDNN: :func:`backend`)."""
    if func not in CONVOLUTION_OPS or not cudnn_settings()[0]:
        return []
    if func is _aten.convolution.default:
        x, w = args[0], args[1]
        stride, padding, dilation, transposed, _, groups = args[3:9]
        if x.dtype not in _CUDNN_DTYPES or not x.numel() or not out.numel():
            return []
        if backend(x, w, args[3:9], capability) not in CUDNN_BACKENDS:
            return []
        geometry = (stride, padding, dilation, groups)
        if transposed:  # a transposed forward is cuDNN's data gradient of the mirror problem
            problem = _problem("backward_data", out, w, x.shape, geometry, in_backward)
        else:
            problem = _problem("forward", x, w, out.shape, geometry, in_backward)
        return [(out, problem)]
    grad_output, x, w = args[0], args[1], args[2]
    stride, padding, dilation, transposed, _, groups, mask = args[4:11]
    if x.dtype not in _CUDNN_DTYPES or not x.numel() or not grad_output.numel():
        return []
    if backend(x, w, args[4:10], capability) not in CUDNN_BACKENDS:
        return []
    geometry = (stride, padding, dilation, groups)
    big, small = (x, grad_output) if not transposed else (grad_output, x)
    plan = []
    if mask[0]:
        kind = "forward" if transposed else "backward_data"
        plan.append((out[0], _problem(kind, big, w, small.shape, geometry, in_backward)))
    if mask[1]:
        plan.append((out[1], _problem("backward_filter", big, w, small.shape, geometry, in_backward)))
    return plan
