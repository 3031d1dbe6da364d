"""What a CUDA sum allocates beside its output, and cuBLASLt's own workspace. Torch-free.

Reductions (``aten/src/ATen/native/cuda/Reduce.cuh``, ``gpu_reduce_kernel``): when the
launch configuration splits each output's inputs over several thread blocks
(``setReduceConfig``: ``ctas_per_output > 1``), the kernel takes a staging buffer for the
blocks' partial results (``global_memory_size()``: accumulator bytes x outputs x
``ctas_per_output`` x ``block.x`` x ``output_vec_size`` when the block does not reduce
along x) and one ``int`` semaphore per output block column (``semaphore_size()``), both
through the caching allocator, and frees them when it returns. :func:`staging_bytes`
follows ``setReduceConfig`` for a sum over the leading dimensions of a contiguous tensor
(the outputs are the fastest-moving dimension: "vectorize output", 4 outputs per thread,
at most 512 / 4 threads per block). The H200 recording ``timm-vit-b16-bf16`` (torch
2.11, 132 SMs, 2,048 threads per SM) shows exactly these sizes for the bias gradients
of a ViT-B/16 at batch 64 (12,608 rows): 77,463,552 B and 24 B for 768 outputs,
139,198,464 B and 72 B for 2,304, 138,412,032 B and 96 B for 3,072, none for the
head's 64 rows. Sums over the fastest-moving dimension ("vectorize input") are not
modelled (no staging). How many blocks a sum splits into depends on the GPU:
``setReduceConfig`` aims at ``multiProcessorCount`` x (``maxThreadsPerMultiProcessor`` /
threads per block) blocks; :func:`threads_per_multiprocessor` gives the second by compute
capability.

Half-precision gradient sums in backward: the same recording takes a float32 result of
the output's shape first, then the staging buffer and semaphores, then the
half-precision output, and frees the float32 result (trace entries 533-541 of a steady
step, each linear's bias gradient; 4,000 B then 2,000 B for the head's), in float16 too
(``timm-resnet50-amp``'s head: 4,000 B, 2,000 B); the forward has no such sums to show
the rule holds there, so it is applied in backward only (:func:`float_result_first`).

cuBLASLt (``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``getCUDABlasLtWorkspace``): an
``addmm`` whose bias is a vector runs cuBLASLt's GEMM with a bias epilogue
(``addmm_out_cuda_impl``'s ``useLtInterface``), which takes its own workspace, 1 MiB
by default (``CUBLASLT_WORKSPACE_SIZE`` in KiB), right after the cuBLAS one, once per
handle, never freed: trace entry 207 of ``timm-vit-b16-bf16`` (the first ``qkv``
linear) and the ResNet-50's head in ``timm-resnet50-amp`` both hold one 1,048,576 B
block to the end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LT_WORKSPACE",
    "Staging",
    "float_result_first",
    "lt_workspace_bytes",
    "staging_bytes",
    "threads_per_multiprocessor",
]

#: cuBLASLt's default workspace: 1024 KiB.
LT_WORKSPACE = 1024 * 1024
#: ``ReduceConfig::MAX_NUM_THREADS`` for non-complex types.
MAX_THREADS = 512
#: Outputs one thread handles when the outputs are contiguous (``get_output_vec_size``).
OUTPUT_VEC = 4
WARP = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256


#: ``cudaDeviceProp::maxThreadsPerMultiProcessor`` where it is not 2,048 (CUDA C++
#: Programming Guide, "Technical Specifications per Compute Capability": maximum number
#: of resident threads per SM; PyTorch's own ``CUDA_MAX_THREADS_PER_SM`` took sm86's 1,536
#: in pytorch/pytorch#45889). 2,048 on compute capability 7.0, 8.0, 8.7, 9.0 and 10.x.
THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536, (12, 0): 1536, (12, 1): 1536}


def threads_per_multiprocessor(capability: tuple[int, int]) -> int:
    """The most threads resident on one SM of compute capability ``capability``."""
    return THREADS_PER_SM.get((capability[0], capability[1]), 2048)


@dataclass(frozen=True)
class Staging:
    """A reduction's global-memory blocks: ``buffer`` and ``semaphores`` bytes (0: none)."""

    buffer: int
    semaphores: int


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def staging_bytes(
    shape: Sequence[int],
    reduced: Sequence[int],
    contiguous: bool,
    multiprocessors: int,
    threads_per_multiprocessor: int,
    accumulator_bytes: int = 4,
) -> Staging:
    """The staging blocks of a sum of a tensor of ``shape`` over the dimensions
    ``reduced`` (non-negative) on a GPU with ``multiprocessors`` SMs of
    ``threads_per_multiprocessor`` threads each; accumulators of ``accumulator_bytes``
    (float32 for float32, float16 and bfloat16 inputs). Modelled only for a
    ``contiguous`` input reduced over leading dimensions with at least 4 contiguous
    outputs (a multiple of 4); other sums give none."""
    dims = sorted(set(reduced))
    if not contiguous or not dims or not multiprocessors or dims != list(range(len(dims))):
        return Staging(0, 0)
    outputs = 1
    for size in shape[len(dims) :]:
        outputs *= size
    inputs = 1
    for size in shape[: len(dims)]:
        inputs *= size
    if outputs < OUTPUT_VEC or outputs % OUTPUT_VEC or inputs < 2:
        return Staging(0, 0)
    dim0, dim1 = outputs // OUTPUT_VEC, inputs
    most = MAX_THREADS // OUTPUT_VEC
    dim0_pow2 = _last_pow2(dim0) if dim0 < most else most
    dim1_pow2 = _last_pow2(dim1) if dim1 < most else most
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, most // width)
    width = min(dim0_pow2, most // height)
    step_output = width  # output_mult[0] = split_output(block_width)
    if inputs < min(height * 16, MAX_VALUES_PER_THREAD):
        return Staging(0, 0)  # the block's rows split the outputs: no global reduction
    per_thread = _div_up(inputs, height)  # input_mult[1] = split_input(block_height)
    grid_x = _div_up(outputs // OUTPUT_VEC, step_output)
    target = multiprocessors * (threads_per_multiprocessor // (width * height))
    if per_thread < MAX_VALUES_PER_THREAD or grid_x > target:
        return Staging(0, 0)
    ctas = max(
        min(_div_up(target, grid_x), _div_up(per_thread, MIN_VALUES_PER_THREAD)),
        _div_up(per_thread, MAX_VALUES_PER_THREAD),
    )
    if ctas <= 1:
        return Staging(0, 0)
    # the block does not reduce along x (outputs are split over x): times block.x x vec
    return Staging(accumulator_bytes * outputs * ctas * width * OUTPUT_VEC, 4 * grid_x)


def float_result_first(itemsize: int, is_float: bool, in_backward: bool) -> bool:
    """Whether a sum of a half-precision (``itemsize`` 2, floating) tensor computes a
    float32 result before its own (see the module doc: backward only)."""
    return in_backward and is_float and itemsize == 2


def lt_workspace_bytes(environ: dict[str, str] | None = None) -> int:
    """cuBLASLt's workspace bytes: ``CUBLASLT_WORKSPACE_SIZE`` (KiB) when set to a
    number, else 1 MiB."""
    value = (os.environ if environ is None else environ).get("CUBLASLT_WORKSPACE_SIZE", "")
    return int(value) * 1024 if value.strip().isdigit() else LT_WORKSPACE
