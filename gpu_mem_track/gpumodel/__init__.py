"""One model of the GPU, shared by the estimator, the snapshot replay and the simulated
GPU: CUDA autocast's op lists (``autocast``), the attention backend CUDA picks and its
kernels' scratch (``attention``), dropout's fused kernel (``dropout``), linear-shaped
einsums (``einsum``), the cuBLAS workspaces (``workspace``), cuDNN's convolution
workspaces and benchmark trials (``cudnn``, ``convops``) and where the driver places
segments (``addresses``); what still differs is listed in ``differences``. The caching
allocator's model is ``gpu_mem_track.allocator``. Modules import torch only where they
must (``workspace``, ``addresses`` and ``differences`` are torch-free)."""

from __future__ import annotations
