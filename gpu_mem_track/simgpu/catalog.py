"""Named GPUs the simulated device can be: memory as torch reports it, compute capability,
cuBLAS workspace default, and the memory the process holds outside PyTorch's allocator.
Torch-free.

``total_memory`` is what ``torch.cuda.get_device_properties(0).total_memory`` reports
(bytes), which is less than the vendor's nominal size: the driver keeps some for itself.
Figures come from a measurement (the H200: ``fixtures/h200``), from published
``get_device_properties`` printouts (torch prints ``total_memory`` in MiB, so these are
exact to the MiB, and vary by a few MiB across drivers) or, where none was found, from
the nominal size less the usual driver reserve (said so in ``source``).

**Non-PyTorch memory** is what the process holds on the GPU outside the caching
allocator: ``context_bytes``, the CUDA context with the kernels loaded lazily at first
use, and ``library_bytes``, the cuBLAS and cuDNN handles (their kernel modules, loaded
at the first matrix multiply and the first convolution). On Hopper they are measured
(``gpu-mem-track probe`` on an H200, torch 2.11+cu130, driver 580: context 518 MiB,
first cuBLAS matmul +158 MiB, first cuDNN convolution +8 MiB; the H100 is the same
architecture with the same CUDA); elsewhere the context is an assumption (300 MiB before
Ampere, 400 MiB on Ampere/Ada, with lazy loading, the libraries included) and said so in
``context_source``. When the user has run the probe on that GPU, its saved result
replaces them (``GpuSpec.measured``, ``with_saved_probe``; the newest ``probe-*.json``
of ``probecache``): ``parse_gpu`` applies it to every catalog name it reads, so every
entry point of the simulated GPU (``run --simulate``, ``simulated_gpu("h200")``,
``%%memtrack --simulate``, ``estimate --gpu``, ``batch-size --gpu``) counts the same
figure, and ``context_source`` says which (``GPU_MEM_TRACK_SAVED_PROBE=off``, or
``parse_gpu(name, saved_probe=False)``, keeps the catalog's; a ``GpuSpec`` passed as is
is used as is). The simulated
allocator may reserve ``capacity``: ``total_memory`` less the non-PyTorch memory, as
``cudaMalloc`` fails on the GPU once reserved plus non-PyTorch memory would pass the
total. A training process can hold more (the nanoGPT run of ``fixtures/h200`` held 758
MiB beyond ``max_memory_reserved`` in NVML's figure, 74 MiB over the probe's: kernels of
other libraries loaded later), which the catalog does not count. The cuBLAS workspace is
PyTorch's default per (handle, stream), allocated through the caching allocator: 32 MiB
on compute capability 9.0 and later, else ``:4096:2:16:8`` (8,519,680 B);
``CUBLAS_WORKSPACE_CONFIG`` overrides it at run time.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import UsageError
from ..gpumodel.workspace import DEFAULT_WORKSPACE, HOPPER_WORKSPACE
from ..probecache import saved_costs, use_saved

__all__ = [
    "ARCHITECTURE_GPUS",
    "GPUS",
    "GpuSpec",
    "multiprocessors_of",
    "parse_gpu",
    "with_saved_probe",
    "workspace_default",
]

MiB = 1 << 20
GiB = 1 << 30


def workspace_default(capability: tuple[int, int]) -> int:
    """PyTorch's default cuBLAS workspace (bytes) for a compute capability."""
    return HOPPER_WORKSPACE if capability >= (9, 0) else DEFAULT_WORKSPACE


def context_default(total_memory: int, capability: tuple[int, int]) -> int:
    """The CUDA context assumed where none was measured: 300 MiB before Ampere, 400 MiB
    on Ampere/Ada, 500 MiB on Hopper and newer (more kernels, larger modules)."""
    if capability >= (9, 0):
        return 500 * MiB
    return 400 * MiB if capability >= (8, 0) else 300 * MiB


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: ``name`` (the catalog's), ``device_name`` (what
    ``torch.cuda.get_device_name`` says), ``total_memory`` (bytes, as torch reports it),
    ``capability`` (major, minor), ``cublas_workspace`` (bytes per cuBLAS handle and
    stream), ``context_bytes`` (the CUDA context, bytes), ``library_bytes`` (the cuBLAS
    and cuDNN handles outside the allocator, bytes; 0 where the context's figure includes
    them), ``multiprocessors`` (SMs), ``source`` (where ``total_memory`` comes from) and
    ``context_source`` (where the non-PyTorch figures come from)."""

    name: str
    total_memory: int
    capability: tuple[int, int]
    cublas_workspace: int
    context_bytes: int
    multiprocessors: int = 0
    source: str = ""
    device_name: str = ""
    library_bytes: int = 0
    context_source: str = ""

    @property
    def non_pytorch_bytes(self) -> int:
        """Bytes the process holds outside the caching allocator: context and libraries."""
        return self.context_bytes + self.library_bytes

    @property
    def capacity(self) -> int:
        """Bytes the caching allocator may reserve: ``total_memory`` less the non-PyTorch
        memory."""
        return max(self.total_memory - self.non_pytorch_bytes, 0)

    def measured(self, context: int, libraries: int, source: str) -> GpuSpec:
        """This GPU with the non-PyTorch memory measured on it (``context`` and
        ``libraries`` bytes; ``source`` says by what): a saved probe result."""
        return replace(self, context_bytes=context, library_bytes=libraries, context_source=source)

    @property
    def arch(self) -> str:
        """``"sm86"`` style architecture name."""
        return f"sm{self.capability[0]}{self.capability[1]}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["capability"] = list(self.capability)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSpec:
        major, minor = data["capability"]
        return cls(
            name=str(data["name"]),
            total_memory=int(data["total_memory"]),
            capability=(int(major), int(minor)),
            cublas_workspace=int(data["cublas_workspace"]),
            context_bytes=int(data["context_bytes"]),
            multiprocessors=int(data.get("multiprocessors", 0)),
            source=str(data.get("source", "")),
            device_name=str(data.get("device_name", "")),
            library_bytes=int(data.get("library_bytes", 0)),
            context_source=str(data.get("context_source", "")),
        )


MEASURED_TOTAL = (
    "measured: torch.cuda.get_device_properties(0).total_memory on an H200 (driver 580.159.04, CUDA 13.0; "
    "fixtures/h200)"
)
_ASSUMED = "assumed: CUDA context with lazy module loading, cuBLAS/cuDNN handles included (not measured)"
#: The H200 probe (``fixtures/h200/logs/probe.log``): context, cuBLAS and cuDNN outside the allocator.
HOPPER_CONTEXT, HOPPER_LIBRARIES = 518 * MiB, (158 + 8) * MiB
HOPPER_SOURCE = (
    "measured by gpu-mem-track probe on an H200 (torch 2.11+cu130, driver 580): CUDA context 518 MiB, "
    "first cuBLAS matmul +158 MiB and first cuDNN convolution +8 MiB outside the allocator"
)
_PRINTOUT = "published torch.cuda.get_device_properties printout"
_OOM_TEXT = "published OOM messages' 'total capacity of 79.15 GiB'"
_NOMINAL = "estimate: vendor datasheet size less the driver's usual reserve (no printout found)"


def _gpu(
    name: str, device_name: str, mib: int, capability: tuple[int, int], sms: int, source: str
) -> GpuSpec:
    total = mib * MiB
    return GpuSpec(
        name=name,
        total_memory=total,
        capability=capability,
        cublas_workspace=workspace_default(capability),
        context_bytes=context_default(total, capability),
        multiprocessors=sms,
        source=source,
        device_name=device_name,
        context_source=_ASSUMED,
    )


def _hopper(spec: GpuSpec, total: int | None = None, source: str = "") -> GpuSpec:
    """``spec`` with the H200 probe's non-PyTorch figures (and a measured total)."""
    where = HOPPER_SOURCE if spec.name == "H200" else f"{HOPPER_SOURCE} (same Hopper architecture and CUDA)"
    spec = spec.measured(HOPPER_CONTEXT, HOPPER_LIBRARIES, where)
    return replace(spec, total_memory=total, source=source) if total is not None else spec


#: The catalog, keyed by lower-case name.
GPUS: dict[str, GpuSpec] = {
    spec.name.lower(): spec
    for spec in (
        _gpu("V100-16GB", "Tesla V100-SXM2-16GB", 16160, (7, 0), 80, f"{_PRINTOUT} (16160 MiB)"),
        _gpu("V100-32GB", "Tesla V100-SXM2-32GB", 32510, (7, 0), 80, _NOMINAL),
        _gpu("T4", "Tesla T4", 15102, (7, 5), 40, f"{_PRINTOUT} (15102 MiB; 14930-15109 seen)"),
        _gpu("A10G", "NVIDIA A10G", 22587, (8, 6), 80, f"{_PRINTOUT} (22587 MiB)"),
        _gpu("L4", "NVIDIA L4", 22478, (8, 9), 58, _NOMINAL),
        _gpu("L40S", "NVIDIA L40S", 45589, (8, 9), 142, f"{_PRINTOUT} (45589 MiB)"),
        _gpu("A100-40GB", "NVIDIA A100-SXM4-40GB", 40536, (8, 0), 108, f"{_PRINTOUT} (40536 MiB)"),
        _gpu(
            "A100-80GB",
            "NVIDIA A100-SXM4-80GB",
            81050,
            (8, 0),
            108,
            _OOM_TEXT,
        ),
        _hopper(
            _gpu(
                "H100-80GB",
                "NVIDIA H100 80GB HBM3",
                81090,
                (9, 0),
                132,
                f"{_PRINTOUT} (81090 MiB; 81082-90)",
            )
        ),
        _hopper(
            _gpu("H200", "NVIDIA H200", 143156, (9, 0), 132, ""),
            150_109_880_320,
            MEASURED_TOTAL,
        ),
        _gpu("RTX-3090", "NVIDIA GeForce RTX 3090", 24268, (8, 6), 82, f"{_PRINTOUT} (24268 MiB)"),
        _gpu("RTX-4090", "NVIDIA GeForce RTX 4090", 24563, (8, 9), 128, f"{_PRINTOUT} (24563 MiB)"),
    )
}

#: The catalog GPU whose SM count a GPU known only by its compute capability takes (an
#: estimate's architecture, ``"ampere"``, or ``SIZE:smXY``): each architecture's
#: data-centre GPU. The count sizes CUDA's reduction staging
#: (:mod:`~gpu_mem_track.gpumodel.reduce`), so the estimator's ``"ampere"`` takes the
#: A100's, as ``run --simulate a100-40gb`` does. Compute capability 10.0 has no GPU in
#: the catalog: no SM count, so no staging.
ARCHITECTURE_GPUS = {
    (7, 0): "v100-16gb",
    (7, 5): "t4",
    (8, 0): "a100-40gb",
    (8, 6): "a10g",
    (8, 9): "l40s",
    (9, 0): "h100-80gb",
}


def multiprocessors_of(capability: tuple[int, int]) -> int:
    """The SMs of :data:`ARCHITECTURE_GPUS`' GPU for ``capability``; 0 (unknown) for
    one it lacks."""
    name = ARCHITECTURE_GPUS.get(tuple(capability))
    return GPUS[name].multiprocessors if name else 0


_CUSTOM = re.compile(r"^\s*([0-9.]+\s*[a-zA-Z]*)\s*:\s*sm_?([0-9])([0-9])\s*$")


def parse_gpu(text: str | GpuSpec, saved_probe: bool | None = None) -> GpuSpec:
    """A catalog name (case-insensitive; ``_`` and spaces read as ``-``), the model of
    exactly one catalog GPU without its memory size or maker (``h100`` is H100-80GB,
    ``4090`` RTX-4090; ``a100`` could be either A100: a ``UsageError`` naming both) or
    ``SIZE:smXY`` (``"24GiB:sm86"``: that much memory as torch reports it, compute
    capability X.Y); a ``GpuSpec`` is returned as is. A catalog GPU takes the
    non-PyTorch memory of the probe's newest saved result for it (``with_saved_probe``)
    unless ``saved_probe`` is False (None: unless ``GPU_MEM_TRACK_SAVED_PROBE=off``).
    ``UsageError`` lists the names."""
    if isinstance(text, GpuSpec):
        return text
    key = re.sub(r"[\s_]+", "-", str(text).strip().lower())
    found = GPUS.get(key) or _by_model(key, str(text))
    if found is not None:
        use = use_saved() if saved_probe is None else saved_probe
        return with_saved_probe(found) if use else found
    custom = _CUSTOM.match(str(text))
    if custom:
        return _custom(custom.group(1), (int(custom.group(2)), int(custom.group(3))), str(text))
    names = ", ".join(spec.name for spec in GPUS.values())
    raise UsageError(f"unknown GPU {text!r}: choose one of {names}, or give SIZE:smXY such as 24GiB:sm86")


def _by_model(key: str, text: str) -> GpuSpec | None:
    """The one catalog GPU that ``key`` names without its memory size or maker's prefix
    (``h100``: H100-80GB; ``4090``: RTX-4090; ``rtx3090``); None for none (``h20`` is
    not H200: the H20 is another GPU); ``UsageError`` naming them for several."""
    bare = key.replace("-", "")

    def names(name: str) -> tuple[str, ...]:
        return (name.replace("-", ""), name.split("-")[0], name.removeprefix("rtx-"))

    hits = [spec for name, spec in GPUS.items() if bare and bare in names(name)]
    if len(hits) > 1:
        raise UsageError(f"GPU {text!r} could be {' or '.join(s.name for s in hits)}: give the whole name")
    return hits[0] if hits else None


def with_saved_probe(spec: GpuSpec, cache_dir: Any = None) -> GpuSpec:
    """``spec`` with the non-PyTorch memory (CUDA context; cuBLAS and cuDNN handles) that
    ``gpu-mem-track probe`` measured on a GPU of its ``device_name``, when a result is
    saved in the cache folder (``probecache.saved_costs``); ``spec`` itself without one."""
    found = saved_costs(spec.device_name, cache_dir)
    return spec if found is None else spec.measured(*found)


def _custom(size: str, capability: tuple[int, int], text: str) -> GpuSpec:
    from ..units import parse_bytes

    try:
        total = parse_bytes(size)
    except ValueError as exc:
        raise UsageError(f"GPU {text!r}: {exc}") from None
    if total <= 0:
        raise UsageError(f"GPU {text!r}: the memory must be positive")
    return GpuSpec(
        name=text.strip(),
        total_memory=total,
        capability=capability,
        cublas_workspace=workspace_default(capability),
        context_bytes=min(context_default(total, capability), total // 4),
        multiprocessors=multiprocessors_of(capability),
        source="given on the command line",
        device_name=f"Simulated GPU ({text.strip()})",
        context_source=_ASSUMED,
    )
