"""Which kernel PyTorch runs a CUDA convolution with: cuDNN (which takes workspaces,
:mod:`~gpu_mem_track.gpumodel.cudnn`) or one of its own kernels (none). Torch-free.

The rule is ``_select_conv_backend`` in ``aten/src/ATen/native/Convolution.cpp`` (torch
2.x) for a CUDA input, with the hooks it asks (``aten/src/ATen/cuda/detail/CUDAHooks.cpp``):
``torch._C._select_conv_backend`` answers the same question on a GPU, and
``scripts/check/conv_backends.py`` compares the two there. In its order:

1. A one-dimensional convolution is viewed as a two-dimensional one of height 1 first
   (``view1d_as_2d``, ``view4d``: the input ``(N, C, L)`` becomes ``(N, C, 1, L)``).
2. An empty batch or channel dimension: ``Empty`` (no kernel).
3. **Depthwise** (``is_depthwise``: not transposed, a 4-d or 5-d input, ``groups`` equal
   to the input channels and above 1, output channels a multiple of them): cuDNN only when
   ``use_cudnn_depthwise`` says so, else PyTorch's ``CudaDepthwise2d`` (``conv_depthwise2d``,
   ``DepthwiseConv2d.cu``) or ``CudaDepthwise3d``, which allocate their outputs only.
   ``use_cudnn_depthwise`` is true when cuDNN is enabled and

   - the input or the weight cannot be indexed with 32-bit offsets (2**31 - 1 elements or
     more): NCHW yes (cuDNN 9.3+), channels-last no (cuDNN after 9.10: "broken");
   - else the layout is channels-last (``cudnn_conv_suggest_memory_format``): yes, always;
   - else (NCHW) only on compute capability 7.0+ (``supportsDepthwiseConvolutionWithCuDNN``)
     for a **float16** input and weight, 4-d, not dilated, the same stride both ways (or
     height 1), at least 32 channels, when ``check_cudnn_depthwise_workload_with_filter``
     (:func:`cudnn_depthwise_workload`) accepts the shape. So float32, bfloat16 and
     float64 NCHW depthwise convolutions, and float16 ones below 32 channels, run
     PyTorch's kernel: no cuDNN workspace.
4. Otherwise cuDNN (``Cudnn``, ``CudnnTranspose``) when ``use_cudnn``: enabled, bfloat16
   only on compute capability 8.0+ (``supportsBFloat16ConvolutionWithCuDNNv8``), and no
   ``output_padding`` at or above its stride.
5. Otherwise PyTorch's slow kernels (``SlowTranspose2d``/``3d``, ``SlowDilated2d``/``3d``
   (every 5-d CUDA input), ``Slow2d``), whose own scratch (``im2col`` columns) is not
   modelled.

Assumed: a CUDA build with cuDNN 9.15 or later (torch 2.11's wheels carry 9.19, recorded
in ``reports/gpu_check/H200/conv_workspaces.txt``), so the rules for cuDNN 9.8 to 9.14
(float16/bfloat16 5-d pointwise NCHW kept off cuDNN) and before 9.3 do not apply. The
workload check is the "simplified version for cudnn 8.2 and above" of torch 2.x
releases; PyTorch's main branch (2026) replaces it with a per-architecture decision tree
(``aten/src/ATen/autoheuristic/DepthwiseConvHeuristic.h``), which may choose otherwise
for float16 NCHW depthwise convolutions of 32 channels or more: not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

__all__ = [
    "CUDNN_BACKENDS",
    "INT32_MAX",
    "ConvCall",
    "cudnn_depthwise_workload",
    "select_backend",
    "use_cudnn_depthwise",
]

#: The backends that run cuDNN (``ConvBackend`` names).
CUDNN_BACKENDS = frozenset({"Cudnn", "CudnnTranspose"})
#: ``canUse32BitIndexMath``'s bound (``std::numeric_limits<int32_t>::max()``).
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ConvCall:
    """One ``aten.convolution`` (or its backward) as backend selection sees it:
    ``input_shape`` and ``weight_shape`` (batch and channels first), the geometry,
    ``dtype`` (torch's name: ``float16``, ``bfloat16``, ``float32``, ...) and
    ``channels_last`` (``cudnn_conv_suggest_memory_format`` is not contiguous)."""

    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int
    dtype: str
    channels_last: bool = False

    def as_2d(self) -> ConvCall:
        """A one-dimensional convolution viewed as a two-dimensional one of height 1
        (``view1d_as_2d``); any other returned as is."""
        if len(self.input_shape) != 3:
            return self
        n, c, length = self.input_shape
        o, i, k = self.weight_shape
        return ConvCall(
            (n, c, 1, length),
            (o, i, 1, k),
            (1, *self.stride),
            (0, *self.padding),
            (1, *self.dilation),
            self.transposed,
            (0, *self.output_padding),
            self.groups,
            self.dtype,
            self.channels_last,
        )

    @property
    def depthwise(self) -> bool:
        """``is_depthwise``: not transposed, 4-d or 5-d, one group per input channel
        (more than one), output channels a multiple of the input channels."""
        channels = self.input_shape[1]
        return (
            not self.transposed
            and len(self.input_shape) in (4, 5)
            and channels == self.groups
            and self.groups > 1
            and self.weight_shape[0] % channels == 0
        )

    @property
    def dilated(self) -> bool:
        return any(d != 1 for d in self.dilation)

    @property
    def output_padding_big(self) -> bool:
        """``is_output_padding_big``: an output padding at or above its stride."""
        return any(p >= s for p, s in zip(self.output_padding, self.stride, strict=False))


def cudnn_depthwise_workload(call: ConvCall) -> bool:
    """``check_cudnn_depthwise_workload_with_filter`` for cuDNN 8.2 and above (torch
    2.x): whether a float16 NCHW depthwise convolution is one cuDNN runs faster."""
    n, channels, height, width = call.input_shape[:4]
    stride = call.stride[1]
    if height == 1 and stride == 1:
        return True
    kh, kw = call.weight_shape[2], call.weight_shape[3]
    if kh != kw or kw not in (1, 3, 5) or width < 7:
        return False
    if stride == 1:
        return True
    if stride != 2:
        return False
    if n == 1:
        return (kw == 1 and width <= 28) or kw in (3, 5)
    if kw == 1 and n <= 16 and channels >= 128 and width <= 7:
        return True
    return kw in (3, 5) and (channels >= 512 or (channels >= 256 and width >= 28))


def _use_cudnn(call: ConvCall, capability: tuple[int, int], enabled: bool) -> bool:
    """``use_cudnn`` with cuDNN 9.15+ (see the module doc)."""
    if not enabled:
        return False
    if call.dtype == "bfloat16" and capability < (8, 0):
        return False
    return not call.output_padding_big


def use_cudnn_depthwise(call: ConvCall, capability: tuple[int, int], enabled: bool) -> bool:
    """``use_cudnn_depthwise`` for a depthwise ``call`` (see the module doc, rule 3)."""
    if not enabled:
        return False
    if prod(call.input_shape) >= INT32_MAX or prod(call.weight_shape) >= INT32_MAX:
        return not call.channels_last
    if call.channels_last:
        return True
    if capability < (7, 0):
        return False
    kernel = (
        _use_cudnn(call, capability, enabled)
        and call.dtype == "float16"
        and len(call.input_shape) == 4
        and not call.dilated
        and (call.stride[0] == call.stride[1] or call.input_shape[2] == 1)
        and call.input_shape[1] >= 32
    )
    return kernel and cudnn_depthwise_workload(call)


def select_backend(call: ConvCall, capability: tuple[int, int], enabled: bool = True) -> str:
    """The ``ConvBackend`` name PyTorch picks for ``call`` on a CUDA device of compute
    ``capability`` with cuDNN ``enabled`` (``torch.backends.cudnn.enabled``): one of
    ``Empty``, ``Cudnn``, ``CudnnTranspose``, ``CudaDepthwise2d``, ``CudaDepthwise3d``,
    ``SlowTranspose2d``, ``SlowTranspose3d``, ``SlowDilated2d``, ``SlowDilated3d``,
    ``Slow2d`` (the module doc's rules)."""
    call = call.as_2d()
    if call.input_shape[0] == 0 or call.input_shape[1] == 0:
        return "Empty"
    volume = len(call.input_shape) == 5
    if call.depthwise:
        if use_cudnn_depthwise(call, capability, enabled):
            return "Cudnn"
        return "CudaDepthwise3d" if volume else "CudaDepthwise2d"
    if _use_cudnn(call, capability, enabled):
        return "CudnnTranspose" if call.transposed else "Cudnn"
    if call.transposed:
        return "SlowTranspose3d" if volume else "SlowTranspose2d"
    if volume:
        return "SlowDilated3d"
    return "SlowDilated2d" if call.dilated else "Slow2d"
