"""Two runs side by side: per line, per function or per ``track()`` label, with the
differences largest first (fp32 vs AMP, batch 32 vs 64, before vs after a change).

``compare_runs`` is pure (two ``runs.Run`` in, a ``Comparison`` out); ``compare_files``
loads what the comparison needs from two paths; ``render_comparison`` returns the text.

Matching:

- ``line``: a source line is identified by its file's base name, its function and its
  stripped code text, so an edit that shifts line numbers still matches; the same text
  twice in one function is told apart by order (first with first, second with second).
- ``function``: by file base name and function; increments summed, peak the highest.
- ``label``: by label text and occurrence (the third ``"step"`` with the third
  ``"step"``); a stamp without a label is keyed by ``(file function)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..runfolder.read import DEFAULT_POINTS, LabelPoint
from ..runfolder.records import LineRecord, by_function
from ..units import counted, format_bytes, format_peak
from .load import Run, Source, detect, load_run

__all__ = ["BY", "CompareRow", "Comparison", "Figures", "compare_files", "compare_runs", "render_comparison"]

#: What runs can be compared by.
BY = ("line", "function", "label")

_CODE_WIDTH = 48


@dataclass(frozen=True)
class Figures:
    """One key's figures in one run. ``where``: line number (``line``), first line
    (``function``) or seconds since the start (``label``). ``value``: bytes, the summed
    increment (``line``, ``function``) or the memory at the stamp (``label``). ``peak``:
    the highest memory while the line or function ran (bytes; None for labels);
    ``peak_exact``: False when that peak is a lower bound (see ``lines.LineRecord``),
    shown as ``>=``. ``hits``: executions (``line`` only)."""

    where: str
    value: int | None
    peak: int | None = None
    hits: int | None = None
    peak_exact: bool = True


@dataclass(frozen=True)
class CompareRow:
    """One matched key. ``key``: for ``line`` (file, function, code), for ``function``
    (file, function), for ``label`` (label,); ``occurrence``: 1 for the first of equal
    keys in a run, 2 for the second... ``a``/``b``: its figures in each run, None where
    the run lacks it. ``difference``: B minus A of ``value`` in bytes (increments: a
    missing side counts as 0; label memory: None unless both sides have it).
    ``peak_difference``: B minus A of ``peak`` where both are known."""

    key: tuple[str, ...]
    occurrence: int
    a: Figures | None
    b: Figures | None
    difference: int | None
    peak_difference: int | None


@dataclass(frozen=True)
class Comparison:
    """Runs ``a`` and ``b`` compared ``by`` line, function or label; ``rows`` largest
    ``|difference|`` first (then largest ``|peak_difference|``; rows without a
    difference last)."""

    by: str
    a: Run
    b: Run
    rows: tuple[CompareRow, ...]

    @property
    def peak_difference(self) -> int | None:
        """B's peak minus A's, in bytes (None if either is unknown)."""
        if self.a.peak is None or self.b.peak is None:
            return None
        return self.b.peak - self.a.peak

    def _repr_html_(self) -> str:
        """HTML for Jupyter's rich display (``html.tables.comparison_html``); ``repr`` stays text."""
        from ..html.tables import comparison_html

        return comparison_html(self)


def compare_files(
    a: str | Path, b: str | Path, by: str | None = None, points: int = DEFAULT_POINTS
) -> Comparison:
    """Load runs ``a`` and ``b`` (see ``runs``) and compare them ``by`` line, function
    or label (default: line when both have per-line records, else label). ``UsageError``
    when a path cannot be loaded or ``by`` cannot apply to it."""
    sources = detect(a), detect(b)
    by = _resolve_by(sources, by)
    need_lines = by in ("line", "function")
    runs = [load_run(s, lines=need_lines, timeline=not need_lines, points=points) for s in sources]
    return compare_runs(runs[0], runs[1], by)


def compare_runs(a: Run, b: Run, by: str) -> Comparison:
    """Compare two loaded runs ``by`` ``"line"``, ``"function"`` or ``"label"``;
    ``UsageError`` when a run lacks what that needs."""
    if by not in BY:
        raise UsageError(f"cannot compare by {by!r} (choose from {', '.join(BY)})")
    if by == "label":
        sides = [_label_figures(_require(run, "labels", by)) for run in (a, b)]
    else:
        figures = _line_figures if by == "line" else _function_figures
        sides = [figures(_require(run, "lines", by)) for run in (a, b)]
    rows = _match(sides[0], sides[1], additive=by != "label")
    return Comparison(by, a, b, tuple(_ranked(rows)))


def render_comparison(comparison: Comparison, top: int = 20) -> str:
    """The comparison as text: a line naming both runs, their peaks and the difference;
    a line saying what the figures mean; a table of the first ``top`` rows (0: all)."""
    a, b = comparison.a, comparison.b
    change = comparison.peak_difference
    percent = f", {100 * change / a.peak:+.1f}%" if change is not None and a.peak else ""
    lines = [
        f"A {a.name}: peak {format_bytes(a.peak)} | B {b.name}: peak {format_bytes(b.peak)} "
        f"| B-A {format_bytes(change, signed=True)}{percent}",
        _meaning(comparison),
    ]
    rows = comparison.rows if top <= 0 else comparison.rows[:top]
    if not rows:
        lines.append(_nothing(comparison))
        return "\n".join(lines) + "\n"
    table = _table_label(rows) if comparison.by == "label" else _table_lines(rows, comparison.by)
    lines.append(table)
    if len(rows) < len(comparison.rows):
        lines.append(f"... {counted(len(comparison.rows) - len(rows), 'more row')} (--top 0 shows all)")
    return "\n".join(lines) + "\n"


def _resolve_by(sources: Sequence[Source], by: str | None) -> str:
    for source in sources:
        if source.kind == "folder" and not source.has_lines:
            raise UsageError(f"cannot compare: {source.path} {_lacks(source, by or 'line')}")
    asked = by
    if by is None:
        by = "line" if all(s.has_lines for s in sources) else "label"
    need = "has_labels" if by == "label" else "has_lines"
    for source in sources:
        if not getattr(source, need):
            why = "" if asked else " (the default when a run has no per-line records)"
            raise UsageError(f"cannot compare by {by}{why}: {source.path} {_lacks(source, by)}")
    return by


def _lacks(source: Source, by: str) -> str:
    if source.kind == "folder" and not source.has_lines:
        return "has neither lines.csv nor timeline.csv (the run stopped before it recorded anything)"
    if by == "label":
        if source.kind == "lines":
            return "is a lines.csv, which has no track() stamps (they are in the run's timeline.csv)"
        return "has no timeline.csv (the run's track() stamps are in it)"
    return "is a MemTracker CSV, which has no per-line records (use --by label)"


def _nothing(comparison: Comparison) -> str:
    """Why the table is empty: neither run has what ``by`` matches."""
    if comparison.by == "label":
        hint = (
            "; --by line compares source lines" if comparison.a.kind == comparison.b.kind == "runner" else ""
        )
        return f"(nothing to compare by label: neither run has track() stamps{hint})"
    return f"(nothing to compare by {comparison.by}: neither run has a traced line)"


def _require(run: Run, part: str, by: str) -> tuple:
    value = getattr(run, part)
    if value is None:
        missing = "track() stamps" if part == "labels" else "per-line records"
        raise UsageError(f"cannot compare by {by}: {run.path} has no {missing}")
    return value


Keyed = dict[tuple[tuple[str, ...], int], Figures]


def _occurrences(items: Iterable[tuple[tuple[str, ...], Figures]]) -> Keyed:
    keyed: Keyed = {}
    seen: dict[tuple[str, ...], int] = {}
    for key, figures in items:
        seen[key] = seen.get(key, 0) + 1
        keyed[(key, seen[key])] = figures
    return keyed


def _line_figures(records: Sequence[LineRecord]) -> Keyed:
    ordered = sorted(records, key=lambda r: (r.file, r.line))
    return _occurrences(
        (
            (os.path.basename(r.file), r.function, r.code.strip()),
            Figures(str(r.line), r.increment, r.peak, r.hits, r.peak_exact),
        )
        for r in ordered
    )


def _function_figures(records: Sequence[LineRecord]) -> Keyed:
    return _occurrences(
        ((os.path.basename(file), function), _function_total(group))
        for (file, function), group in by_function(list(records)).items()
    )


def _function_total(group: list[LineRecord]) -> Figures:
    highest = max(group, key=lambda r: (r.peak, r.peak_exact))
    return Figures(
        str(group[0].line), sum(r.increment for r in group), highest.peak, None, highest.peak_exact
    )


def _label_figures(labels: Sequence[LabelPoint]) -> Keyed:
    return _occurrences(((_label_key(p),), Figures(f"{p.elapsed:.2f}", p.memory)) for p in labels)


def _label_key(point: LabelPoint) -> str:
    return point.label or f"({os.path.basename(point.file)} {point.function})"


def _match(a: Keyed, b: Keyed, additive: bool) -> list[CompareRow]:
    rows = []
    for key, occurrence in list(a) + [k for k in b if k not in a]:
        left, right = a.get((key, occurrence)), b.get((key, occurrence))
        rows.append(
            CompareRow(
                key,
                occurrence,
                left,
                right,
                _difference(left, right, "value", additive),
                _difference(left, right, "peak", False),
            )
        )
    return rows


def _difference(a: Figures | None, b: Figures | None, field: str, additive: bool) -> int | None:
    left = getattr(a, field) if a is not None else None
    right = getattr(b, field) if b is not None else None
    if left is not None and right is not None:
        return right - left
    if additive and (left is not None or right is not None):
        return (right or 0) - (left or 0)
    return None


def _ranked(rows: list[CompareRow]) -> list[CompareRow]:
    # sorted() is stable: equal rows keep A's order, then B's.
    return sorted(
        rows, key=lambda r: (r.difference is None, -abs(r.difference or 0), -abs(r.peak_difference or 0))
    )


def _meaning(comparison: Comparison) -> str:
    a, b = comparison.a, comparison.b
    sources = (
        a.memory_source if a.memory_source == b.memory_source else f"{a.memory_source} vs {b.memory_source}"
    )
    if comparison.by == "label":
        text = f"by label: memory ({sources}) at each track() stamp, matched by label and occurrence"
    elif comparison.by == "function":
        text = f"by function ({sources}): increments summed over the function's lines; peak: the highest"
    else:
        text = (
            f"by line ({sources}): increment = memory after minus before, summed over executions; "
            "peak = the highest while it ran"
        )
    if a.memory_source != b.memory_source:
        text += "; note: the runs measure different things"
    return text + "; largest difference first"


def _table_lines(rows: Sequence[CompareRow], by: str) -> str:
    from tabulate import tabulate

    headers = ["file", "function", "line A", "line B"]
    headers += ["code"] if by == "line" else []
    headers += ["increment A", "increment B", "B-A", "peak A", "peak B", "peak B-A"]
    headers += ["hits A", "hits B"] if by == "line" else []
    body = []
    for row in rows:
        function = row.key[1] if by == "line" or row.occurrence == 1 else f"{row.key[1]} #{row.occurrence}"
        cells = [row.key[0], function, _side(row.a, "where"), _side(row.b, "where")]
        cells += [_code(row.key[2])] if by == "line" else []
        cells += [_bytes(row.a, "value"), _bytes(row.b, "value"), format_bytes(row.difference, signed=True)]
        cells += [_peak(row.a), _peak(row.b), _signed(row.peak_difference)]
        cells += [_side(row.a, "hits"), _side(row.b, "hits")] if by == "line" else []
        body.append(cells)
    align = ["left"] * 2 + ["right"] * 2 + (["left"] if by == "line" else [])
    align += ["right"] * (len(headers) - len(align))
    return tabulate(body, headers=headers, tablefmt="simple", colalign=align, disable_numparse=True)


def _table_label(rows: Sequence[CompareRow]) -> str:
    from tabulate import tabulate

    headers = ["label", "#", "at A (s)", "at B (s)", "memory A", "memory B", "B-A"]
    body = [
        [
            row.key[0],
            str(row.occurrence),
            _side(row.a, "where"),
            _side(row.b, "where"),
            _bytes(row.a, "value"),
            _bytes(row.b, "value"),
            _signed(row.difference),
        ]
        for row in rows
    ]
    align = ["left"] + ["right"] * 6
    return tabulate(body, headers=headers, tablefmt="simple", colalign=align, disable_numparse=True)


def _side(figures: Figures | None, field: str) -> str:
    if figures is None:
        return "-"
    value = getattr(figures, field)
    return "" if value is None else str(value)


def _bytes(figures: Figures | None, field: str) -> str:
    return "-" if figures is None else format_bytes(getattr(figures, field))


def _peak(figures: Figures | None) -> str:
    if figures is None:
        return "-"
    return format_peak(figures.peak, figures.peak_exact)


def _signed(value: int | None) -> str:
    return "" if value is None else format_bytes(value, signed=True)


def _code(text: str) -> str:
    return text if len(text) <= _CODE_WIDTH else text[: _CODE_WIDTH - 3] + "..."
