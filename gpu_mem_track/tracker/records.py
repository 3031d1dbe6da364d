"""The data model: plain, frozen records and pure functions over them.

Nothing here measures or prints. Collectors (``census``, ``readers``) produce these
records, renderers (``render``, ``csvlog``) consume them, and every record converts to
and from a plain ``dict`` so reports can be saved, reloaded and compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..categories import CATEGORIES, KIND_CATEGORY, LABELS, ByteCategories
from ..units import format_bytes

__all__ = [
    "CATEGORY_LABELS",
    "KINDS",
    "STAGES",
    "Categories",
    "ProbeResult",
    "ProbeStage",
    "Census",
    "GroupChange",
    "Ledger",
    "Skipped",
    "Stamp",
    "TensorGroup",
    "diff_census",
]

#: Tensor kinds (the categories of visible bytes), in precedence order: a storage that
#: several tensors share counts once, in the first kind any of them has. So a weight
#: autograd saves for backward stays a Parameter, and a model input it saves stays an
#: Input; an Activation is a tensor autograd saves (``saved.SavedTensorRecorder``) that is
#: nothing above and whose storage the program holds under no name (a named tensor stays
#: a Tensor); a Tensor ("other") is any other visible tensor.
KINDS = ("Parameter", "Buffer", "Optimizer state", "Gradient", "Input", "Activation", "Tensor")

#: How each kind is spelled in the categories line of the text report (its category's
#: label, ``categories.LABELS``; the CSV's columns are ``cat_`` + the category's name).
CATEGORY_LABELS = {kind: LABELS[KIND_CATEGORY[kind]] for kind in KINDS}

GroupKey = tuple[str, tuple[int, ...], str, str]


@dataclass(frozen=True, repr=False)
class TensorGroup:
    """Live storages of one kind, shape, dtype and device.

    ``count`` is the number of distinct storages; ``nbytes`` their total size in bytes
    (on CUDA rounded to the allocator's 512 B blocks); ``names`` the known names of the
    tensors that own them (``features.0.weight``, ``exp_avg of fc.bias``, ``x``).
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    count: int
    nbytes: int
    names: tuple[str, ...] = ()

    @property
    def key(self) -> GroupKey:
        return (self.kind, self.shape, self.dtype, self.device)

    def __repr__(self) -> str:
        return (
            f"<TensorGroup {self.kind} {self.shape} {self.dtype} {self.device}: {self.count} x,"
            f" {format_bytes(self.nbytes)}{_names_summary(self.names)}>"
        )


@dataclass(frozen=True)
class Skipped:
    """Tensors the census saw but did not count, with the reason.

    ``reason`` is one of ``"meta"``, ``"fake"`` or ``"no storage"`` (its storage cannot be
    read, as for wrapper subclasses like DTensor, or reading it raised);
    ``nominal_bytes`` is what they would occupy if real (0 when unknown).
    """

    reason: str
    count: int
    nominal_bytes: int = 0


@dataclass(frozen=True, repr=False)
class Census:
    """Every live tensor storage on one device at one moment, grouped.

    ``views`` counts tensors that share a storage already counted (views, slices,
    ``expand``, ``.data``): they add no bytes.
    """

    device: str
    groups: tuple[TensorGroup, ...] = ()
    views: int = 0
    skipped: tuple[Skipped, ...] = ()

    @property
    def nbytes(self) -> int:
        """Total bytes of the counted storages."""
        return sum(g.nbytes for g in self.groups)

    @property
    def storages(self) -> int:
        """Number of distinct storages counted."""
        return sum(g.count for g in self.groups)

    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes per tensor kind, every kind present (0 when absent), in ``KINDS`` order."""
        totals = dict.fromkeys(KINDS, 0)
        for group in self.groups:
            totals[group.kind] = totals.get(group.kind, 0) + group.nbytes
        return totals

    @property
    def categories(self) -> Categories:
        """Bytes per category; they sum to ``nbytes``."""
        return Categories.from_kinds(self.bytes_by_kind())

    def __repr__(self) -> str:
        return (
            f"<Census {self.device}: {format_bytes(self.nbytes)} in {self.storages} storages,"
            f" {len(self.groups)} groups>"
        )


@dataclass(frozen=True)
class Categories(ByteCategories):
    """Bytes of the counted (visible) storages per category, each storage in exactly one.

    The fields are the categories of ``categories.CATEGORIES``, one per kind of ``KINDS``
    (``other`` is the kind ``"Tensor"``): a storage shared by tensors of several kinds
    counts in the first of them in ``KINDS`` order. ``activation`` is what autograd saved
    for backward, as far as a saved-tensor recorder saw it (0 without one). On CUDA,
    bytes are the allocator's 512 B-rounded blocks.
    """

    @classmethod
    def from_kinds(cls, by_kind: dict[str, int]) -> Categories:
        """From bytes per kind name (``"Optimizer state"``); unknown kinds count as other."""
        values = dict.fromkeys(CATEGORIES, 0)
        for kind, nbytes in by_kind.items():
            values[KIND_CATEGORY.get(kind, "other")] += nbytes
        return cls(**values)


@dataclass(frozen=True, repr=False)
class GroupChange:
    """How one tensor group changed between two stamps.

    ``count_delta`` and ``bytes_delta`` are signed; ``count`` and ``nbytes`` are the
    group's values after the change. ``names`` lists the names that appeared (for a
    growth) or disappeared (for a shrink), or the group's names when none changed.
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    count_delta: int
    bytes_delta: int
    count: int
    nbytes: int
    names: tuple[str, ...] = ()

    @property
    def sign(self) -> str:
        """``+`` when the group grew, ``-`` when it shrank."""
        if self.bytes_delta != 0:
            return "+" if self.bytes_delta > 0 else "-"
        return "+" if self.count_delta >= 0 else "-"

    def __repr__(self) -> str:
        return (
            f"<GroupChange {self.sign}{abs(self.count_delta)} {self.kind} {self.shape} {self.dtype}"
            f" {self.device}: {format_bytes(self.bytes_delta, signed=True)}{_names_summary(self.names)}>"
        )


@dataclass(frozen=True, repr=False)
class Ledger:
    """Where the device's memory goes at one stamp, all figures in bytes.

    Measured parts (``None`` when unknown or not applicable):

    - ``tensors``: bytes of the live tensors the census found (visible tensors).
    - ``allocated``, ``requested``, ``reserved``, ``peak_allocated``: the CUDA caching
      allocator's ``allocated_bytes``, ``requested_bytes``, ``reserved_bytes`` (current)
      and ``allocated_bytes`` peak, as ``torch.cuda.memory_stats`` reports them.
    - ``driver``: device memory used by this process as the driver sees it (what
      nvidia-smi shows); ``driver_source`` says how it was read: ``"nvml process"``
      or ``"nvml device-wide"`` (the whole GPU, when this process is not visible, as
      in some containers).
    - ``context``: CUDA context cost measured by the probe (``gpu_mem_track.tracker.probe``).
    - ``rss``: resident set size of this process (host memory; shown on CPU runs).
    - ``categories``: ``tensors`` split by category (``Categories``); None when not
      recorded (reports written before categories existed).

    Derived parts are properties: ``hidden``, ``cache``, ``framework`` and
    ``framework_other``; ``breakdown()`` lists the categories and these parts, which add
    up to ``total``.
    """

    device: str
    tensors: int
    allocated: int | None = None
    requested: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    driver: int | None = None
    driver_source: str | None = None
    context: int | None = None
    rss: int | None = None
    categories: Categories | None = None

    def __post_init__(self) -> None:
        if self.categories is not None and self.categories.total != self.tensors:
            raise ValueError(f"categories add up to {self.categories.total} B, not tensors {self.tensors} B")

    def __repr__(self) -> str:
        return f"<Ledger {self._summary()}>"

    def _summary(self) -> str:
        """``cuda:0 tensors 1.00 MiB, allocated ..., ...``: the measured figures that are known."""
        figures = [("tensors", self.tensors)] + [
            (name, getattr(self, name)) for name in ("allocated", "reserved", "driver", "rss")
        ]
        return f"{self.device} " + ", ".join(f"{n} {format_bytes(v)}" for n, v in figures if v is not None)

    @property
    def hidden(self) -> int | None:
        """Allocated bytes no visible tensor accounts for: tensors only C++ holds (saved
        activations no recorder attributed, library workspaces) and block slack (the
        allocator does not split a large block whose leftover is 1 MiB or less, and
        counts it whole as allocated)."""
        return None if self.allocated is None else self.allocated - self.tensors

    @property
    def cache(self) -> int | None:
        """Reserved but unallocated bytes held by the caching allocator."""
        if self.reserved is None or self.allocated is None:
            return None
        return self.reserved - self.allocated

    @property
    def framework(self) -> int | None:
        """Driver-level bytes outside the allocator: CUDA context, library workspaces, kernels."""
        if self.driver is None or self.reserved is None:
            return None
        return self.driver - self.reserved

    @property
    def framework_other(self) -> int | None:
        """Framework cost beyond the probed CUDA context (cuBLAS/cuDNN handles, loaded kernels)."""
        if self.framework is None or self.context is None:
            return None
        return self.framework - self.context

    def parts(self) -> dict[str, int | None]:
        """The ledger's additive parts; on CUDA with a driver reading they sum to ``driver``."""
        return {
            "tensors": self.tensors,
            "hidden": self.hidden,
            "cache": self.cache,
            "framework": self.framework,
        }

    def breakdown(self) -> dict[str, int]:
        """Every byte of ``total`` in exactly one part: the categories (by label, as in
        ``Categories.by_label``; ``{"tensors": n}`` when not recorded), then, as far as
        they are known, ``hidden``, ``allocator cache`` and ``framework``."""
        parts = self.categories.by_label() if self.categories is not None else {"tensors": self.tensors}
        for name, value in self._known_parts():
            parts[name] = value
        return parts

    @property
    def total(self) -> int:
        """The figure ``breakdown()`` adds up to, in bytes (which one: ``total_name``)."""
        return int(getattr(self, self.total_name))

    @property
    def total_name(self) -> str:
        """``"driver"``, ``"reserved"`` or ``"allocated"``, the furthest figure whose parts
        are all known, else ``"tensors"``."""
        return ("tensors", "allocated", "reserved", "driver")[len(self._known_parts())]

    def _known_parts(self) -> list[tuple[str, int]]:
        """hidden, then cache, then framework: each only when the one before is known."""
        known = []
        for name, value in (
            ("hidden", self.hidden),
            ("allocator cache", self.cache),
            ("framework", self.framework),
        ):
            if value is None:
                break
            known.append((name, value))
        return known


@dataclass(frozen=True, repr=False)
class Stamp:
    """One ``track()`` call: where and when, the ledger, and the changes since the last call.

    ``time`` is seconds since the epoch; ``elapsed`` seconds since the tracker started.
    ``file`` is the caller's path as Python reports it (``co_filename``). Its ``repr`` is
    one short line (a REPL or notebook shows it after every ``track()``); the fields hold
    the rest.
    """

    seq: int
    time: float
    elapsed: float
    file: str
    line: int
    function: str
    label: str
    ledger: Ledger
    changes: tuple[GroupChange, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    views: int = 0

    def __repr__(self) -> str:
        label = f" {self.label!r}" if self.label else ""
        where = f"{self.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{self.line}"
        changes = f"{len(self.changes)} change{'s' if len(self.changes) != 1 else ''}"
        return f"<Stamp #{self.seq} {where}{label}: {self.ledger._summary()}; {changes}>"

    def to_dict(self) -> dict[str, Any]:
        """A dict of plain values (records become dicts; shapes and names stay tuples)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stamp:
        """Inverse of ``to_dict``."""
        values = dict(data)
        ledger = dict(values["ledger"])
        if ledger.get("categories") is not None:
            ledger["categories"] = Categories.from_dict(ledger["categories"])
        values["ledger"] = Ledger(**ledger)
        values["changes"] = tuple(
            GroupChange(**{**c, "shape": tuple(c["shape"]), "names": tuple(c["names"])})
            for c in values.get("changes", ())
        )
        values["skipped"] = tuple(Skipped(**s) for s in values.get("skipped", ()))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def _repr_html_(self) -> str:
        """HTML for Jupyter's rich display (``html.tables.stamp_html``); ``repr`` stays text."""
        from ..html.tables import stamp_html

        return stamp_html(self)


def _names_summary(names: tuple[str, ...]) -> str:
    """`` (a, b, ... +3 more)`` for a one-line repr; empty without names."""
    if not names:
        return ""
    shown = ", ".join(repr(n) for n in names[:2])
    return f" ({shown}{f', ... +{len(names) - 2} more' if len(names) > 2 else ''})"


def diff_census(before: Census | None, after: Census) -> tuple[GroupChange, ...]:
    """Group changes from ``before`` to ``after``, largest byte change first.

    A group appears when its storage count or byte total changed; ``before=None``
    means everything in ``after`` is new.
    """
    old = {g.key: g for g in (before.groups if before else ())}
    new = {g.key: g for g in after.groups}
    changes = []
    for key in list(new) + [k for k in old if k not in new]:
        was, now = old.get(key), new.get(key)
        count_delta = (now.count if now else 0) - (was.count if was else 0)
        bytes_delta = (now.nbytes if now else 0) - (was.nbytes if was else 0)
        if count_delta == 0 and bytes_delta == 0:
            continue
        changes.append(_change(key, was, now, count_delta, bytes_delta))
    changes.sort(key=lambda c: (-abs(c.bytes_delta), -abs(c.count_delta), c.kind, c.shape))
    return tuple(changes)


def _change(
    key: GroupKey, was: TensorGroup | None, now: TensorGroup | None, count_delta: int, bytes_delta: int
) -> GroupChange:
    old_names = set(was.names) if was else set()
    new_names = set(now.names) if now else set()
    growing = bytes_delta > 0 or (bytes_delta == 0 and count_delta > 0)
    moved = (new_names - old_names) if growing else (old_names - new_names)
    source = now if (growing and now) or not was else was
    names = tuple(n for n in source.names if n in moved) if moved else source.names
    kind, shape, dtype, device = key
    return GroupChange(
        kind=kind,
        shape=shape,
        dtype=dtype,
        device=device,
        count_delta=count_delta,
        bytes_delta=bytes_delta,
        count=now.count if now else 0,
        nbytes=now.nbytes if now else 0,
        names=names,
    )


#: The probe's stages, in the order it enters them.
STAGES = ("before CUDA", "CUDA context", "first cuBLAS matmul", "first cuDNN convolution")


@dataclass(frozen=True)
class ProbeStage:
    """Readings after one stage: driver-level bytes and the allocator's reserved bytes."""

    name: str
    driver: int
    reserved: int


@dataclass(frozen=True)
class ProbeResult:
    """Stages measured on one device, and the framework cost of each step between them.

    ``uuid`` is the GPU's UUID as torch reports it ("" when unknown, as in results saved
    before it was recorded).
    """

    device: str
    gpu_name: str
    driver_source: str
    torch_version: str
    stages: tuple[ProbeStage, ...]
    uuid: str = ""

    def costs(self) -> dict[str, int]:
        """Bytes each stage added outside the caching allocator, keyed by stage name."""
        costs = {}
        for before, after in zip(self.stages, self.stages[1:]):
            costs[after.name] = (after.driver - before.driver) - (after.reserved - before.reserved)
        return costs

    @property
    def context(self) -> int:
        """The CUDA context's cost in bytes (the second stage's cost)."""
        return self.costs().get(STAGES[1], 0)

    @property
    def total(self) -> int:
        """Framework cost once CUDA, cuBLAS and cuDNN are all started, in bytes."""
        return sum(self.costs().values())

    def to_dict(self) -> dict[str, Any]:
        """A dict of plain values (stages become dicts)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        """Inverse of ``to_dict``."""
        stages = tuple(ProbeStage(**s) for s in data["stages"])
        return cls(**{**data, "stages": stages})
