"""The classic MemTracker's helper methods, with the same meanings and units (MiB).

The classic tool (gpu_mem_track.py of Pytorch-Memory-Utils) offers, beside ``track()``:
``get_tensors()`` (the live tensors on the GPU), ``get_tensor_usage()`` (their size in
MiB), ``get_allocate_usage()`` (``torch.cuda.memory_allocated()`` in MiB),
``clear_cache()`` (a garbage collection, then ``torch.cuda.empty_cache()``) and
``print_all_gpu_tensor()`` (one line per tensor). Its README example calls them, so a
drop-in successor provides them. Differences, all on purpose: they look at the tracked
device (``MemTracker.device``, which may be the CPU), ``get_tensor_usage`` counts each
storage once (a view adds nothing), and nothing here starts CUDA.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import torch

from ..units import format_bytes

__all__ = ["ClassicMethods"]

MiB = 2**20


class ClassicMethods:
    """Mixed into ``MemTracker``: the classic tool's helpers beside ``track()``."""

    def get_tensors(self) -> Iterator[torch.Tensor]:
        """The live tensor objects on the tracked device, each once (views included).

        A generator, as in the classic tool: holding its tensors keeps them alive.
        """
        tracker: Any = self
        target = torch.device(tracker.device)
        seen: set[int] = set()
        for obj in tracker.live_objects():
            if id(obj) in seen or not issubclass(type(obj), torch.Tensor):
                continue
            seen.add(id(obj))
            try:
                on_target = obj.device == target
            except Exception:  # a tensor subclass whose attributes raise
                continue
            if on_target:
                yield obj

    def get_tensor_usage(self) -> float:
        """MiB held by the live tensors on the tracked device: each storage once (on CUDA
        in the allocator's 512 B blocks), saved activations included while recorded."""
        tracker: Any = self
        return tracker.tensor_census().nbytes / MiB

    def get_allocate_usage(self) -> float:
        """MiB the CUDA caching allocator has allocated on the tracked device
        (``torch.cuda.memory_allocated``); 0.0 on the CPU or before the program started CUDA."""
        tracker: Any = self
        reading = tracker.memory_reader.allocator(tracker.device)
        return 0.0 if reading is None else reading.allocated / MiB

    def clear_cache(self) -> None:
        """Collect garbage, then return the CUDA allocator's unused cached memory to the
        driver (``torch.cuda.empty_cache()``, only once the program has started CUDA).

        An action you ask for: it changes what ``reserved`` and nvidia-smi show next.
        ``track()`` never does this.
        """
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def print_all_gpu_tensor(self, file: TextIO | None = None) -> None:
        """Print one line per live tensor on the tracked device: size, dtype and its
        elements' bytes (a view shows the bytes it spans, as in the classic tool)."""
        out = file or sys.stdout
        tracker: Any = self
        for tensor in tracker.get_tensors():
            try:
                shape, dtype = tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")
                nbytes = tensor.numel() * tensor.element_size()
            except Exception:
                continue
            print(f"Size:{shape} | {dtype} | {format_bytes(nbytes)}", file=out)
