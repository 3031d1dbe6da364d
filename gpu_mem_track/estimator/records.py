"""Records of the estimator and the batch-size finder: frozen data, nothing measured here.

All byte figures are *device bytes*: for a CUDA target each storage counts the block the
simulated caching allocator hands out for it (512 B multiples; a large block up to 1 MiB
over the request counts whole), for a CPU target the storage's exact size. Element counts
are exact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from operator import attrgetter
from typing import Any

from ..categories import LEGACY_NAMES, ByteCategories
from ..dispatch.records import ValueRead

#: Optimizer names ``estimate`` and the finder accept (``"none"``: no optimizer step).
OPTIMIZERS = ("adam", "adamw", "sgd", "none")

__all__ = [
    "BatchProbe",
    "BatchSizeResult",
    "Breakdown",
    "Estimate",
    "LayerEstimate",
    "PhasePeak",
    "RankPeak",
    "ValueRead",
]

#: Phases of a simulated training step, in order. A user's step (``estimate(step=fn)``)
#: also has ``"after step"`` (after the optimizer step); its ``"loss"`` is everything
#: between a forward pass and the next backward pass or optimizer step.
PHASES = ("step start", "forward", "loss", "backward", "optimizer step", "after step")


@dataclass(frozen=True)
class Breakdown(ByteCategories):
    """Live device bytes at one moment, split by what the storages are (the categories
    of ``categories.CATEGORIES``, as the census names them).

    ``activation`` holds storages created in the forward pass that outlive it (saved for
    backward, or the output); ``other`` is everything else not named here
    (intermediates freed within a phase, the loss, backward's working tensors,
    optimizer scratch). The older names (``parameters``, ..., ``temporaries``) still
    read as properties.
    """


for _old, _new in LEGACY_NAMES.items():
    setattr(Breakdown, _old, property(attrgetter(_new), doc=f"The ``{_new}`` bytes (older name)."))


@dataclass(frozen=True)
class PhasePeak:
    """The highest live device bytes within one phase, and the op and module at that moment.

    ``module`` is the innermost module running (forward only; ``""`` elsewhere).
    """

    phase: str
    peak: int
    op: str
    module: str = ""


@dataclass(frozen=True)
class LayerEstimate:
    """One module's own parameters and the activations created while it ran.

    ``parameters`` counts elements of the module's direct parameters (not its children's);
    ``activation_elements`` and ``activation_bytes`` cover storages created while this
    module was the innermost one running that were still alive when the forward pass
    ended.
    """

    name: str
    type: str
    parameters: int
    parameter_bytes: int
    activation_elements: int
    activation_bytes: int


@dataclass(frozen=True)
class RankPeak:
    """One rank's peak device bytes in a distributed estimate, and its phase."""

    rank: int
    peak: int
    phase: str


@dataclass(frozen=True)
class Estimate:
    """A simulated step's memory on the ``device`` target (see the module doc for units).

    Totals: ``parameter_bytes``, ``buffer_bytes``, ``gradient_bytes`` (after backward),
    ``optimizer_state_bytes`` (after the step, ``optimizer_states`` tensors),
    ``input_bytes``, ``activation_bytes`` (at the end of the forward pass).
    ``host_bytes``: tensors the step keeps in host memory when the target is CUDA
    (Adam's ``step`` counters with ``capturable=False``), not in any device figure.
    ``peak`` is the highest allocated device bytes during the measured step (on CUDA,
    ``max_memory_allocated``: whole allocator blocks, cuBLAS workspaces included);
    ``at_peak`` splits the storages live then (``peak`` minus ``cublas_workspace`` when
    the workspaces exist by then); ``phases`` gives each phase's own peak. On the CUDA
    target the step runs through the caching allocator's model: ``reserved_peak`` is
    the highest reserved bytes (``max_memory_reserved``), ``reserved_at_peak`` and
    ``largest_free_block`` are the reserved bytes and the largest free cached block at
    the allocated peak, ``allocator`` its settings (``PYTORCH_CUDA_ALLOC_CONF`` form,
    ``""`` for the defaults); on the CPU target they are None. ``cublas_workspace``: the
    bytes of the cuBLAS workspaces allocated (one per handle: forward and backward),
    cuBLASLt's (taken by an ``addmm`` with a bias vector) with them.
    ``rounding`` names the rounding applied. ``step`` is the user's step function
    (``""``: the built-in step). Training steps are measured as the second of two
    identical steps, so the optimizer state already exists, as in a training loop.
    ``loss`` names the loss function; ``value_reads`` lists the values the model's code
    read from meta tensors (see :mod:`~gpu_mem_track.dispatch.values`).

    Distributed (``world_size`` over 1, ``strategy`` not ``"none"``): the figures are
    those of ``rank``, the rank with the highest peak (on the CUDA target each rank runs
    through its own allocator model); ``ranks`` gives every rank's peak (ranks holding
    the same share are simulated once).
    """

    model: str
    device: str
    rounding: str
    training: bool
    optimizer: str
    dtype: str
    amp: bool
    inputs: tuple[str, ...]
    parameters: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_states: int
    optimizer_state_bytes: int
    host_bytes: int
    input_bytes: int
    activation_elements: int
    activation_bytes: int
    peak: int
    at_peak: Breakdown
    phases: tuple[PhasePeak, ...]
    layers: tuple[LayerEstimate, ...]
    loss: str = "default"
    value_reads: tuple[ValueRead, ...] = ()
    reserved_peak: int | None = None
    reserved_at_peak: int | None = None
    largest_free_block: int | None = None
    cublas_workspace: int = 0
    allocator: str = ""
    step: str = ""
    world_size: int = 1
    strategy: str = "none"
    rank: int = 0
    ranks: tuple[RankPeak, ...] = ()

    @property
    def fragmentation(self) -> int | None:
        """Reserved minus allocated bytes at the peak (the allocator's cache then; None
        without the allocator model)."""
        return None if self.reserved_at_peak is None else self.reserved_at_peak - self.peak

    @property
    def peak_phase(self) -> PhasePeak:
        """The phase holding the step's peak (the first one when two tie)."""
        return max(self.phases, key=lambda p: p.peak)

    @property
    def largest_activation_layer(self) -> LayerEstimate | None:
        """The module holding the most activation bytes (``None`` when there are none)."""
        holders = [layer for layer in self.layers if layer.activation_bytes]
        return max(holders, key=lambda layer: layer.activation_bytes) if holders else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists for tuples), for JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Estimate:
        """Inverse of :meth:`to_dict`."""
        values = dict(data)
        values["inputs"] = tuple(values["inputs"])
        values["at_peak"] = Breakdown.from_dict(values["at_peak"])
        values["phases"] = tuple(PhasePeak(**p) for p in values["phases"])
        values["layers"] = tuple(LayerEstimate(**layer) for layer in values["layers"])
        values["value_reads"] = tuple(ValueRead(**read) for read in values.get("value_reads", ()))
        values["ranks"] = tuple(RankPeak(**r) for r in values.get("ranks", ()))
        return cls(**values)

    def _repr_html_(self) -> str:
        """HTML for Jupyter's rich display (``html.tables.estimate_html``); ``repr`` stays text."""
        from ..html.tables import estimate_html

        return estimate_html(self)


@dataclass(frozen=True)
class BatchProbe:
    """One evaluation of the peak: ``peak`` bytes at ``batch`` (``None``: it did not run)."""

    batch: int
    peak: int | None

    def fits(self, budget: int) -> bool:
        """Whether this batch ran and stayed within ``budget`` bytes."""
        return self.peak is not None and self.peak <= budget


@dataclass(frozen=True)
class BatchSizeResult:
    """The largest batch whose peak fits a budget, and how it was found.

    ``batch`` is 0 when even the smallest batch tried does not fit. ``peak`` is the peak
    at ``batch`` and ``margin = budget - peak`` (bytes; both ``None`` when ``batch`` is 0).
    ``intercept`` (bytes) and ``slope`` (bytes per sample) give the line
    ``peak(batch) = intercept + slope * batch`` through the answer and the nearest probe
    at most 3/4 of its batch, else the probe nearest it (the least-squares line through
    the samples when nothing fits).
    ``probes`` lists every evaluation in order; ``source`` says what gave the peaks
    and ``budget_source`` where the budget came from.
    """

    batch: int
    budget: int
    peak: int | None
    margin: int | None
    intercept: float
    slope: float
    probes: tuple[BatchProbe, ...]
    source: str
    budget_source: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchSizeResult:
        """Inverse of :meth:`to_dict`."""
        values = dict(data)
        values["probes"] = tuple(BatchProbe(**p) for p in values["probes"])
        return cls(**values)
