"""Cheap memory readings for the line runner: one call per line event.

A sampler returns ``(current, high_water)`` in bytes: the memory the run reports (its
``source``) and a high-water mark that only the process moves. The runner finds the peak
of a line from the high-water mark *without resetting it*: when the mark rose while the
line ran, the new mark is the line's exact peak; otherwise the peak is at least the larger
of the readings before and after (a lower bound). ``extras()`` gives the slower figures
of the timeline, read less often.

Nothing here imports torch at module import, so the tracing engines can be tested on a
Python without torch.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Protocol

from ..devices import Device, parse_device
from ..ranks import rank_device
from ..runfolder.records import HEAP_SOURCE

__all__ = [
    "CudaSampler",
    "FakeSampler",
    "HeapSampler",
    "RssSampler",
    "Sampler",
    "Extras",
]


#: (driver, rss) in bytes, None where unknown.
Extras = tuple["int | None", "int | None"]


class Sampler(Protocol):
    #: what ``sample()[0]`` measures: ``"cuda allocator"`` (allocated bytes) or
    #: ``"process RSS"``
    source: str
    #: the allocator's reserved bytes at the last ``sample()`` (None where none)
    reserved: int | None
    #: allocations plus frees the allocator had counted at the last ``sample()``, since it
    #: started (0 where nothing counts them): each is one ``alloc`` or ``free_requested``
    #: entry of a memory snapshot's trace, so ``run --snapshot`` finds a line's entries
    events: int

    def sample(self) -> tuple[int, int]: ...

    def extras(self) -> Extras: ...


class RssSampler:
    """The process's resident set size (``/proc/self/statm``, read with one ``pread``)
    and its high-water mark (``getrusage``'s ``ru_maxrss``). Elsewhere than Linux the
    current RSS comes from ``ru_maxrss`` too, so only peaks are meaningful there."""

    source = "process RSS"
    reserved = None
    events = 0

    def __init__(self) -> None:
        import resource

        self._getrusage = resource.getrusage
        self._self = resource.RUSAGE_SELF
        # ru_maxrss is in KiB on Linux, bytes on macOS.
        self._maxrss_unit = 1 if sys.platform == "darwin" else 1024
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._highest = 0
        try:
            self._statm: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None

    def sample(self) -> tuple[int, int]:
        high = self._getrusage(self._self).ru_maxrss * self._maxrss_unit
        if self._statm is None:
            return high, high
        current = int(os.pread(self._statm, 128, 0).split()[1]) * self._page
        # The kernel syncs the two counters lazily: keep the mark at or above every reading.
        if current > self._highest:
            self._highest = current
        return current, max(high, self._highest)

    def extras(self) -> Extras:
        return None, self.sample()[0]

    @staticmethod
    def peak_tolerance(peak: int) -> int:
        """How far below the run's peak a line may peak, and by how much more than that
        it must rise, to be named for the peak (see ``profiler``): 1% of the peak and at
        least 1 MiB, since RSS moves by whole pages and freed memory is reused without
        returning to the system."""
        return max(2**20, peak // 100)

    def close(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None


class HeapSampler:
    """The C heap in use (glibc's ``mallinfo2()``: bytes in chunks malloc handed out,
    ``uordblks``, plus its separately mapped large chunks, ``hblkhd``). A read walks
    malloc's free lists: a few microseconds in a training loop (5.4 us with 232 free
    chunks), milliseconds in a heavily fragmented heap (3.4 ms with 15,600).
    On the CPU that is tensor storage (PyTorch's CPU allocator calls malloc) plus other
    C/C++ data, but not Python objects (their own arenas); a freed tensor subtracts at
    once, where RSS would not move. There is no high-water mark, so ``sample()`` returns
    0 for it and every line's peak is a lower bound. ``extras`` reads the RSS."""

    source = HEAP_SOURCE
    reserved = None

    def __init__(self) -> None:
        self._mallinfo2 = mallinfo2()
        if self._mallinfo2 is None:
            raise ValueError("needs glibc 2.33 or later (mallinfo2), which this system lacks")
        self._rss = RssSampler()

    def sample(self) -> tuple[int, int]:
        info = self._mallinfo2()
        return info.uordblks + info.hblkhd, 0

    def extras(self) -> Extras:
        return None, self._rss.sample()[0]

    @staticmethod
    def peak_tolerance(peak: int) -> int:
        return max(2**20, peak // 100)

    def close(self) -> None:
        self._rss.close()


def mallinfo2() -> Any:
    """glibc's ``mallinfo2`` as a ctypes function returning its struct, or None where the
    C library has none (musl, macOS, glibc before 2.33)."""
    import ctypes

    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
            + ("uordblks", "fordblks", "keepcost")
        ]

    function.restype = MallInfo2
    function.argtypes = []
    return function


class CudaSampler:
    """The CUDA caching allocator of one device: allocated bytes and their peak, read from
    the allocator's statistics; never resets anything, never imports torch or initialises
    CUDA itself (until the program has done both every reading is 0). ``reserved`` and
    ``events`` follow each sample; ``extras`` reads the driver's figure (NVML) and RSS.

    ``stats``: where the statistics come from, ``stats(device_index)`` returning the
    nested dict of ``torch.cuda.memory_stats_as_nested_dict`` (default: torch's, once the
    program has started CUDA); tests pass a fake.

    ``device``: the CUDA device (a ``devices.Device``, as the runner parsed it; the text
    ``cuda``/``cuda:N`` is parsed here); ``self.device`` is its text ``cuda:N``, what the
    memory readers take.

    Inside a simulated GPU (``run --simulate``) it reads the simulation's allocator
    model through its live counters (``simgpu.running.live_counters``), never the real
    GPU, and ``extras`` gives no driver figure.

    ``local_rank``: in a distributed launch whose device was not named, the device is
    decided when the program has started CUDA (see ``ranks.rank_device``) and ``device``
    then names it; until then ``device`` is ``cuda:<local_rank>``. ``torch_module``: the
    torch to read (default: the one the program imported; tests pass a fake).

    The real GPU's read: once the program has started CUDA, the sampler reads the five
    figures through the native module ``cuda_stats`` when it is built and agrees with
    torch's dict on this device (``gpu_mem_track.native.cudastats``; it saves 11.4 us a
    line on an H200), else through ``torch._C._cuda_memoryStats``; a missing module is
    built in the background meanwhile and used once built. Only when the statistics come
    from torch's own ``_cuda_memoryStats`` (not a ``stats`` given here, nor a simulated
    GPU's). ``stats_reader`` says which read the sampler uses from then on: ``"native"``
    or ``"dict"``; ``GPU_MEM_TRACK_NATIVE=off`` keeps the dict. ``native``: the
    ``cuda_stats`` module to check and use (tests pass a fake; default: the one built
    for this torch).
    """

    source = "cuda allocator"
    reserved: int | None = 0
    #: the allocator's reserved-bytes peak at the last ``sample()``
    reserved_peak = 0
    events = 0
    #: ``"native"`` (``cuda_stats``) or ``"dict"`` (``torch._C._cuda_memoryStats``)
    stats_reader = "dict"
    #: samples between two looks for a native reader being built in the background (or
    #: not checked yet: nothing allocated to compare)
    LOOK_EVERY = 4096

    def __init__(
        self,
        device: Device | str,
        reader: Any = None,
        stats: Any = None,
        local_rank: int | None = None,
        torch_module: Any = None,
        native: Any = None,
    ) -> None:
        from ..tracker.readers import reader_for

        parsed = parse_device(device) if local_rank is None else Device("cuda", local_rank)
        self._index = parsed.ordinal
        self.device = str(parsed.with_index(self._index))
        self._local_rank = local_rank
        self._reader = reader or reader_for(self.device)
        self._torch = torch_module
        self._cuda: Any = None
        self._stats: Any = stats
        self._started = stats is not None
        self._native = native
        self._read: Any = None  # the native read, once checked
        self._look_in = 0  # samples until the next look for the native read (0: none)
        self._simulated: Any = None

    def sample(self) -> tuple[int, int]:
        read = self._read
        if read is not None:
            allocated, peak, self.reserved, self.reserved_peak, self.events = read(self._index)
            return allocated, peak
        if not self._started and not self._start():
            return 0, 0
        simulated = self._simulated
        if simulated is not None:
            allocated, reserved = simulated.allocated_bytes, simulated.reserved_bytes
            calls = simulated.allocations
            self.reserved, self.reserved_peak = reserved.current, reserved.peak
            self.events = calls.allocated + calls.freed
            return allocated.current, allocated.peak
        stats = self._stats(self._index)
        allocated = stats["allocated_bytes"]["all"]
        reserved = stats["reserved_bytes"]["all"]
        self.reserved, self.reserved_peak = reserved["current"], reserved["peak"]
        calls = stats["allocation"]["all"]  # counted under the lock that records the trace
        self.events = calls["allocated"] + calls["freed"]
        if self._look_in:
            self._look_in -= 1
            if not self._look_in:
                self._find_native()
        return allocated["current"], allocated["peak"]

    def _start(self) -> bool:
        """Whether the program has imported torch and started CUDA (asked until it has)."""
        cuda = self._cuda
        if cuda is None:
            torch = self._torch or sys.modules.get("torch")
            if torch is None:
                return False
            cuda = self._cuda = torch.cuda
            # The nested dict as the allocator returns it: memory_stats() would also
            # flatten and sort its ~200 keys at every line.
            self._stats = getattr(torch._C, "_cuda_memoryStats", None) or cuda.memory_stats_as_nested_dict
        if not cuda.is_initialized():
            return False
        self._started = True  # CUDA never stops once started: ask once
        from ..simgpu.running import live_counters

        self._simulated = live_counters()  # a simulated GPU: its model, not the real GPU
        if self._simulated is not None:
            self._cuda = None  # no driver (NVML) reading of the real GPU in extras()
        if self._local_rank is not None:
            self._index = rank_device(cuda, self._local_rank)
            self.device = f"cuda:{self._index}"
        if self._simulated is None:
            self._find_native()
        return True

    def _find_native(self) -> None:
        """Read natively from now on when the native read agrees with torch's dict here;
        while it is being built, or before the device has allocated anything to compare,
        look again in ``LOOK_EVERY`` samples."""
        from ..native import cudastats

        torch = self._torch or sys.modules.get("torch")
        real = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)
        nested = getattr(self._cuda, "memory_stats_as_nested_dict", None)
        # torch's own read of the real allocator: not a simulated GPU's, not a given one
        if (
            real is None
            or self._stats is not real
            or getattr(nested, "__module__", "") != "torch.cuda.memory"
        ):
            return
        if self._native is None and cudastats.module() is None:
            cudastats.request_build()
            self._look_in = self.LOOK_EVERY if cudastats.building() else 0
            return
        self._read = cudastats.checked_read(self._index, real, self._native)
        if self._read is not None:
            self.stats_reader = "native"
        elif cudastats.awaiting(self._index, self._native):  # nothing allocated yet to compare
            self._look_in = self.LOOK_EVERY

    def ooms(self) -> int:
        """The out-of-memory errors the allocator has raised so far (``num_ooms``): the
        simulated GPU's model, else torch's statistics dict (read at loop headers by the
        stop rule, not at every line); 0 before the program has started CUDA."""
        if not self._started and not self._start():
            return 0
        from ..simgpu.running import running_gpu

        gpu = running_gpu()
        if gpu is not None:
            return int(gpu.allocator.stats.num_ooms)
        return int(self._stats(self._index).get("num_ooms", 0))

    def extras(self) -> Extras:
        driver = self._reader.driver(self.device) if self._cuda is not None else None
        return driver.nbytes if driver else None, self._reader.rss()

    def close(self) -> None:
        pass


class FakeSampler:
    """A sampler whose memory the test sets: ``current`` and the high-water mark it
    drives (``allocate``/``free``)."""

    source = "fake"
    reserved = None
    events = 0

    def __init__(self) -> None:
        self.current = 0
        self.high = 0

    def allocate(self, nbytes: int) -> None:
        self.current += nbytes
        self.high = max(self.high, self.current)
        self.events += 1

    def free(self, nbytes: int) -> None:
        self.current -= nbytes
        self.events += 1

    def sample(self) -> tuple[int, int]:
        return self.current, self.high

    def extras(self) -> Extras:
        return None, None

    def close(self) -> None:
        pass
