"""The advisor's records: one simulated trial (``Trial``), one row of the table
(``FitRow``) and the whole answer (``FitResult``), each with ``to_dict``/``from_dict``.

Pure data: nothing here runs a trial, prints or imports torch. Bytes are the simulated
caching allocator's; ``capacity`` is what it may reserve on the simulated GPU (its total
memory less the CUDA context and libraries).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..levers.records import LeverReport as LeverNote  # what a lever did in one trial

__all__ = ["Accumulation", "BatchAnswer", "FitResult", "FitRow", "LeverNote", "OutOfMemory", "Trial"]

#: What ``FitRow.fits`` says: a completed run at most ``threshold`` of the capacity
#: ("yes"), a completed run above it but within the capacity ("tight"), a run that ran
#: out of memory ("no"), a run that failed for another reason ("failed").
FITS = ("yes", "tight", "no", "failed")


@dataclass(frozen=True)
class OutOfMemory:
    """Where a simulated run first ran out of memory: ``at`` (``"file:line"``), the
    ``request`` that failed and the ``allocated`` and ``reserved`` bytes then, against
    ``capacity`` (bytes)."""

    at: str
    request: int
    allocated: int
    reserved: int
    capacity: int

    @property
    def shortfall(self) -> int:
        """Bytes the allocator lacked at that point: reserved + request - capacity. The run
        stopped there, so the whole run needs at least this much more."""
        return self.reserved + self.request - self.capacity

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutOfMemory:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Trial:
    """One simulated run of the unmodified script: with ``levers`` applied (names, in
    the order given) at ``batch`` (None: the script's own arguments), in run folder
    ``folder``. ``exit_code`` is the script's (None: no run description was written);
    ``peak`` and ``reserved_peak`` the allocated and reserved peaks (bytes),
    ``peak_at`` the line of the peak (``"file:line"``), ``oom`` the first
    out-of-memory (None: none), ``capacity`` the bytes the allocator may reserve,
    ``notes`` the levers' reports, ``error`` why it failed when it did not run out of
    memory ("" otherwise), ``stopped`` why the runner stopped its loop (``"steady"``,
    ``"max-iterations"``, ``"max-seconds"``; "" when it did not), ``compiled`` the
    simulation's note on torch.compile regions run as eager ("" without any:
    ``runfolder.simtext.compiled_note``)."""

    levers: tuple[str, ...]
    batch: int | None
    folder: str
    exit_code: int | None
    peak: int | None = None
    reserved_peak: int | None = None
    peak_at: str = ""
    oom: OutOfMemory | None = None
    capacity: int = 0
    notes: tuple[LeverNote, ...] = ()
    error: str = ""
    stopped: str = ""
    compiled: str = ""

    @property
    def completed(self) -> bool:
        """The script ran to its end (or left its steady loop) without running out."""
        return self.exit_code == 0 and self.oom is None and self.reserved_peak is not None

    def fits(self, threshold: float) -> str:
        """One of ``FITS`` for this trial at ``threshold`` (a fraction of the capacity)."""
        if self.oom is not None:
            return "no"
        if not self.completed or self.reserved_peak is None:
            return "failed"
        if self.reserved_peak > self.capacity:
            return "no"
        return "yes" if self.reserved_peak <= threshold * self.capacity else "tight"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["levers"] = list(self.levers)
        out["oom"] = None if self.oom is None else self.oom.to_dict()
        out["notes"] = [note.to_dict() for note in self.notes]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        oom = data.get("oom")
        return cls(
            levers=tuple(data["levers"]),
            batch=data.get("batch"),
            folder=str(data["folder"]),
            exit_code=data.get("exit_code"),
            peak=data.get("peak"),
            reserved_peak=data.get("reserved_peak"),
            peak_at=str(data.get("peak_at", "")),
            oom=None if oom is None else OutOfMemory.from_dict(oom),
            capacity=int(data.get("capacity", 0)),
            notes=tuple(LeverNote.from_dict(n) for n in data.get("notes", ())),
            error=str(data.get("error", "")),
            stopped=str(data.get("stopped", "")),
            compiled=str(data.get("compiled", "")),
        )


@dataclass(frozen=True)
class BatchAnswer:
    """The largest batch that fits with a row's levers: ``batch`` (0: not even the
    smallest tried), its trial's ``reserved_peak`` and ``folder``, and ``tried``, the
    batches run (each a simulated trial), in the order run. ``flat_from``: where the
    peak stops growing with the batch (``find_batch``), the smallest batch tried whose
    peaks equal those at ``batch``: any batch fits, as every step takes the samples of
    batch ``flat_from`` at most (None: the peak grew up to ``batch``)."""

    batch: int
    reserved_peak: int | None
    folder: str
    tried: tuple[int, ...]
    flat_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tried"] = list(self.tried)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchAnswer:
        return cls(
            batch=int(data["batch"]),
            reserved_peak=data.get("reserved_peak"),
            folder=str(data.get("folder", "")),
            tried=tuple(data.get("tried", ())),
            flat_from=data.get("flat_from"),
        )


@dataclass(frozen=True)
class Accumulation:
    """The user's batch kept with a smaller one: ``batch`` samples per step over
    ``steps`` gradient-accumulation steps (``batch * steps`` samples per optimizer step,
    at least the batch asked for), set by ``how`` (the script's own argument, e.g.
    ``"--gradient_accumulation_steps=2"``)."""

    batch: int
    steps: int
    how: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Accumulation:
        return cls(batch=int(data["batch"]), steps=int(data["steps"]), how=str(data["how"]))


@dataclass(frozen=True)
class FitRow:
    """One row of the table: ``label`` ("as it is", a lever's name or ``"a + b"``),
    ``levers`` (names), ``peak`` and ``reserved_peak`` (bytes; for a run that ran out,
    the highest it reached before it did), ``fits`` (one of ``FITS``), ``margin`` (bytes:
    capacity - reserved peak when it completed; minus the shortfall when it ran out,
    which is then at least that much: ``at_least``), ``line`` (of the peak, or of the
    out-of-memory), ``cost`` and ``change`` (the levers' words and lines, joined with
    "; "), ``changes_results``, ``folder`` (the trial's run folder) and ``batch`` (with
    a batch argument: the largest batch that fits with these levers), ``stopped`` (as
    ``Trial.stopped``), ``edits`` (each lever's change with the ``file:line`` where it
    goes, "" where no place is known: the parts of ``change``, lever by lever)."""

    label: str
    levers: tuple[str, ...]
    peak: int | None
    reserved_peak: int | None
    fits: str
    margin: int | None
    at_least: bool
    line: str
    cost: str
    change: str
    changes_results: bool
    folder: str
    batch: BatchAnswer | None = None
    stopped: str = ""
    edits: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["levers"] = list(self.levers)
        out["edits"] = [list(edit) for edit in self.edits]
        out["batch"] = None if self.batch is None else self.batch.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitRow:
        batch = data.get("batch")
        skip = ("levers", "batch", "stopped", "edits")
        values = {f.name: data[f.name] for f in fields(cls) if f.name not in skip}
        return cls(
            **values,
            levers=tuple(data["levers"]),
            batch=None if batch is None else BatchAnswer.from_dict(batch),
            stopped=str(data.get("stopped", "")),
            edits=tuple((str(c), str(w)) for c, w in data.get("edits", ())),
        )


@dataclass(frozen=True)
class FitResult:
    """The advisor's answer for ``script`` (with ``args``) on simulated GPU ``gpu``.

    ``capacity``: bytes the allocator may reserve there (``total_memory`` less the CUDA
    context and libraries); ``threshold``: the fraction of it above which a run counts
    as tight. ``verdict``: ``"fits"`` (as it is), ``"found"`` (a change fits:
    ``recommended`` is its row's label), ``"tight"`` (it fits as it is but nothing tried
    brings it under the threshold), ``"smaller"`` (nothing fits at the user's batch;
    ``recommended`` is the row whose largest batch is the largest, on a tie the
    cheapest, and ``accumulation`` how to keep the batch asked for where the script has
    a gradient-accumulation argument), ``"none"`` (nothing tried fits, at any batch
    tried) or ``"failed"`` (the script failed for a reason other than memory: no levers
    tried). ``rows``: the baseline first, then each lever alone, then any combination
    tried. ``not_applied``: ``(lever, reason)`` for levers not tried as rows (they did
    not apply to this script, or cannot change anything in it). ``batch_arg`` and
    ``batch``: the batch argument and its value in ``args`` (None without one).
    ``folder``: the session folder holding every trial's run folder; ``trials``: how
    many simulated runs it took; ``seconds``: wall time; ``compiled``: the baseline
    trial's note on torch.compile regions simulated as eager ("" without any)."""

    script: str
    args: tuple[str, ...]
    gpu: str
    total_memory: int
    capacity: int
    threshold: float
    verdict: str
    rows: tuple[FitRow, ...]
    recommended: str | None
    not_applied: tuple[tuple[str, str], ...]
    folder: str
    trials: int
    seconds: float
    batch_arg: str | None = None
    batch: int | None = None
    accumulation: Accumulation | None = None
    compiled: str = ""

    @property
    def exit_code(self) -> int:
        """0: it fits as asked (as it is, or with a change found); 3: it fits only with a
        smaller batch; 1: nothing tried fits at any batch, or the script failed for
        another reason."""
        if self.verdict in ("fits", "found", "tight"):
            return 0
        return 3 if self.verdict == "smaller" else 1

    def row(self, label: str) -> FitRow:
        """The row labelled ``label`` (KeyError when there is none)."""
        for row in self.rows:
            if row.label == label:
                return row
        raise KeyError(label)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["args"] = list(self.args)
        out["rows"] = [row.to_dict() for row in self.rows]
        out["not_applied"] = [list(pair) for pair in self.not_applied]
        out["accumulation"] = None if self.accumulation is None else self.accumulation.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitResult:
        skip = ("args", "rows", "not_applied", "accumulation")
        values = {f.name: data[f.name] for f in fields(cls) if f.name not in skip and f.name in data}
        accumulation = data.get("accumulation")
        return cls(
            **values,
            accumulation=None if accumulation is None else Accumulation.from_dict(accumulation),
            args=tuple(data["args"]),
            rows=tuple(FitRow.from_dict(row) for row in data["rows"]),
            not_applied=tuple((str(a), str(b)) for a, b in data.get("not_applied", ())),
        )
