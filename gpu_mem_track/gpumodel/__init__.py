"""One model of the GPU, shared by the estimator, the snapshot replay and the simulated
GPU: CUDA autocast's op lists (``autocast``), the attention backend CUDA picks
(``attention``), the cuBLAS workspaces (``workspace``) and cuDNN's convolution
workspaces and benchmark trials (``cudnn``, ``convops``). The caching allocator's model
is ``gpu_mem_track.allocator``. Modules import torch only where they must (``workspace``
is torch-free)."""

from __future__ import annotations
