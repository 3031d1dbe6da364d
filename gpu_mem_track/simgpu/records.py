"""What a simulated GPU session records besides memory: value reads that got a
placeholder, data-dependent shapes given an upper bound, torch.compile calls (run as
eager code) and the out-of-memory error. Plain frozen records; torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Bound", "Compiled", "OutOfMemory", "Placeholder"]


@dataclass(frozen=True)
class Placeholder:
    """A value read from a simulated tensor whose value is unknown: ``op`` (``item``,
    ``copy to cpu``, ...) at ``filename``:``line`` (the first frame outside torch and
    this package) got a placeholder (0, ``False`` or zeros) ``count`` times. Control
    flow that depends on it may have gone another way than on the GPU."""

    filename: str
    line: int
    op: str
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placeholder:
        return cls(str(data["filename"]), int(data["line"]), str(data["op"]), int(data.get("count", 1)))


@dataclass(frozen=True)
class Bound:
    """A data-dependent shape (``nonzero``, a boolean mask, ``unique``, ...) taken at its
    upper bound (every element selected): ``op`` at ``filename``:``line``, ``bound`` the
    number of elements (rows for ``nonzero``) assumed, ``count`` the times it happened."""

    filename: str
    line: int
    op: str
    bound: int
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Bound:
        return cls(
            str(data["filename"]),
            int(data["line"]),
            str(data["op"]),
            int(data["bound"]),
            int(data.get("count", 1)),
        )


@dataclass(frozen=True)
class Compiled:
    """A compiled region the simulated GPU ran as eager code: ``api`` (``torch.compile``,
    ``nn.Module.compile`` or ``torch._dynamo.optimize``) called at ``filename``:``line``
    (the first frame outside torch and this package) ``count`` times, with ``backend``
    (``inductor``, ``aot_eager``, ... or the backend callable's name) and ``mode``
    (``default``, ``reduce-overhead``, ``max-autotune``, ...; empty for
    ``torch._dynamo.optimize``). Under the simulation TorchDynamo skips every frame (a
    dispatch mode is active), so the region's memory is eager PyTorch's: what Inductor's
    partitioner saves for backward, its buffer reuse and CUDA graphs' pools are not
    modelled."""

    filename: str
    line: int
    api: str
    backend: str
    mode: str = ""
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Compiled:
        return cls(
            str(data["filename"]),
            int(data["line"]),
            str(data["api"]),
            str(data["backend"]),
            str(data.get("mode", "")),
            int(data.get("count", 1)),
        )


@dataclass(frozen=True)
class OutOfMemory:
    """The simulated GPU ran out at ``filename``:``line``: ``request`` bytes asked for
    (the segment the allocator needed, as torch's message says), with ``allocated`` and
    ``reserved`` bytes held at that moment, of ``capacity`` (what the allocator may
    reserve: total memory less the non-PyTorch memory, the CUDA context and the cuBLAS/cuDNN
    handles, or the lower limit ``set_per_process_memory_fraction`` set); ``message`` is the
    ``torch.OutOfMemoryError`` text raised."""

    filename: str
    line: int
    request: int
    allocated: int
    reserved: int
    capacity: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutOfMemory:
        return cls(
            str(data["filename"]),
            int(data["line"]),
            int(data["request"]),
            int(data["allocated"]),
            int(data["reserved"]),
            int(data["capacity"]),
            str(data["message"]),
        )
