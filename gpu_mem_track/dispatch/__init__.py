"""Watching a step op by op, below both the estimator and the simulated GPU.

``lifetimes`` is the dispatch mode that sees every storage born and dying (on meta or real
tensors); ``memory`` is the device memory it takes each storage from (exact sizes, or the
simulated GPU's caching allocator) and reads ``PYTORCH_CUDA_ALLOC_CONF``; ``values`` is
the dispatch mode that keeps real values beside small meta tensors, so model code that
reads a tensor's data can run on them, and answers repeated ops on the others from
``metacache`` (their outputs' metadata, remembered by their inputs'); ``records`` holds
what it reports (torch-free).
The estimator and the simulated GPU (``simgpu``) both build on these; nothing here
imports either of them.
"""

from __future__ import annotations
