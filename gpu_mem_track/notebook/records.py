"""What the notebook magics measured: plain frozen records (nothing here measures or prints).

``StatementMemory`` is one ``%memtrack`` statement, ``CellProfile`` one ``%%memtrack``
cell. Both display as HTML tables in Jupyter (``_repr_html_``, ``html.tables``) and as text
in a terminal IPython (``_repr_pretty_``, ``notebook.render``); ``repr`` stays the
dataclass's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..runfolder.records import LineRecord, SimulationInfo
from ..tracker.records import GroupChange, Stamp

__all__ = ["CellProfile", "StatementMemory"]


@dataclass(frozen=True)
class StatementMemory:
    """One statement's memory on ``device``.

    ``source``: what ``before``/``after`` measure: ``"cuda allocator"`` (allocated bytes)
    on a GPU, ``"tensors"`` (the census's bytes of live tensors on the device) on the CPU.
    ``peak_source``: ``"cuda allocator"`` or ``"process RSS"``; ``peak_before`` its reading
    before the statement and ``peak`` the highest it reached while the statement ran,
    read from a high-water mark that is never reset: exact (``peak_exact``) when the mark
    rose, else the larger of the readings before and after (a lower bound).
    ``tensors_before``/``tensors_after``: census bytes; ``rss_before``/``rss_after``: the
    process's resident set size (None where unreadable); ``changes``: the tensor groups
    the statement created or freed (``tracker.records.diff_census``), largest first;
    ``seconds``: wall time. All sizes in bytes.
    """

    statement: str
    device: str
    source: str
    before: int
    after: int
    peak_source: str
    peak_before: int
    peak: int
    peak_exact: bool
    tensors_before: int
    tensors_after: int
    rss_before: int | None
    rss_after: int | None
    changes: tuple[GroupChange, ...]
    seconds: float

    @property
    def increment(self) -> int:
        """``after - before``: what the statement added (negative: freed), in bytes."""
        return self.after - self.before

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StatementMemory:
        values = dict(data)
        values["changes"] = tuple(
            GroupChange(**{**c, "shape": tuple(c["shape"]), "names": tuple(c["names"])})
            for c in data["changes"]
        )
        return cls(**values)

    def _repr_html_(self) -> str:
        from ..html.tables import statement_html

        return statement_html(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        from .render import render_statement

        printer.text(render_statement(self).rstrip("\n"))


@dataclass(frozen=True)
class CellProfile:
    """One cell run under the line profiler (the runner's engine), its code compiled as
    ``filename`` (a pseudo-file such as ``<memtrack-cell-3>``).

    ``source``: ``"cuda allocator"`` or ``"process RSS"``, what the line figures measure
    (see ``runfolder.records.LineRecord``); ``lines``: one record per line of the cell (and of
    functions the cell defines) that ran; ``censuses``: the automatic censuses after lines
    that grew memory by at least ``census_threshold`` bytes (``tracker.records.Stamp``);
    ``peak``: the highest memory seen (bytes) and ``peak_line`` the cell line reaching it
    (None when no line ran); ``top``: how many lines the summary lists; ``seconds``: wall time;
    ``simulation``: what the simulated GPU recorded when the cell ran on one (``%%memtrack
    --simulate``; ``runfolder.records.SimulationInfo``), else None.
    """

    filename: str
    device: str
    source: str
    lines: tuple[LineRecord, ...]
    censuses: tuple[Stamp, ...]
    peak: int
    peak_line: int | None
    census_threshold: int | None
    top: int
    seconds: float
    simulation: SimulationInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.simulation is not None:
            data["simulation"] = self.simulation.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CellProfile:
        values = dict(data)
        values["lines"] = tuple(LineRecord.from_dict(r) for r in data["lines"])
        values["censuses"] = tuple(Stamp.from_dict(s) for s in data["censuses"])
        if values.get("simulation") is not None:
            values["simulation"] = SimulationInfo.from_dict(values["simulation"])
        return cls(**values)

    def _repr_html_(self) -> str:
        from ..html.tables import cell_html

        return cell_html(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        from .render import render_cell

        printer.text(render_cell(self).rstrip("\n"))
