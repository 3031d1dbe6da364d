"""Two snapshot analyses compared line by line and phase by phase (``snapshot A --compare
B``): per line and per phase, the bytes each allocated in its trace, the bytes each held
at its own peak, and the request sizes whose counts differ.

The inputs are analyses as ``SnapshotAnalysis.to_dict()`` gives them (what a report
folder's ``snapshot.json`` holds), so a comparison can be made from two snapshots or two
report folders. Differences are B minus A.

How lines are matched: by file, line number and function. Snapshots recorded on two
machines name one file by two paths (``/home/me/train.py``, ``train.py``), so files are
matched by name: each file of A with the file of B of the same name whose path agrees
with it on the most trailing folders (``models/resnet.py`` goes with ``models/resnet.py``
before ``utils/resnet.py``), each file used once; pseudo-sites (``<no frames>``,
``<before recording>``) match by their text. A file is shown by the trailing part of its
path that both agree on, and at least as much as tells it from its side's other files
(its name alone where the paths differ above it and the name is unique; the whole path,
as recorded, where both record the same one). A line whose number moved (the code
changed between the runs) shows up twice, once on each side, under the same file name.

Not known here: which allocations of A correspond to which of B beyond their line,
phase and request size; lines are matched, not allocations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UsageError

__all__ = [
    "LineComparison",
    "PhaseComparison",
    "SizeDifference",
    "SnapshotComparison",
    "compare_analyses",
    "match_files",
]


@dataclass(frozen=True)
class SizeDifference:
    """A request size (bytes) and how many allocations of it A and B made."""

    size: int
    count_a: int
    count_b: int

    @property
    def bytes(self) -> int:
        """B's allocations of this size minus A's, in bytes."""
        return (self.count_b - self.count_a) * self.size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Figures:
    """One side's figures of a line or phase (zeros where it has none)."""

    hits: int = 0
    allocated: int = 0
    at_peak: int = 0


class _TwoSides:
    """What a line's and a phase's comparison share: the order of the rows."""

    allocated_a: int
    allocated_b: int
    at_peak_a: int
    at_peak_b: int

    @property
    def difference(self) -> int:
        """The larger of the two differences (allocated, held at the peak), in bytes:
        the order of the lines, and of the phases."""
        return max(abs(self.allocated_b - self.allocated_a), abs(self.at_peak_b - self.at_peak_a))


@dataclass(frozen=True)
class LineComparison(_TwoSides):
    """One matched line. ``where``: the file as both agree on it, ``:line`` and the
    function; ``file_a``/``file_b``: each side's recorded path (``""``: the side has no
    such line); ``phase_a``/``phase_b``: the phase most of its bytes were allocated in;
    ``hits``: allocations; ``allocated``: their bytes (blocks); ``at_peak``: bytes it held
    at that side's peak; ``sizes``: the request sizes whose counts differ, largest
    difference in bytes first."""

    where: str
    file_a: str
    file_b: str
    function: str
    line: int
    code: str
    phase_a: str
    phase_b: str
    hits_a: int
    hits_b: int
    allocated_a: int
    allocated_b: int
    at_peak_a: int
    at_peak_b: int
    sizes: tuple[SizeDifference, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sizes": [s.to_dict() for s in self.sizes], "difference": self.difference}


@dataclass(frozen=True)
class PhaseComparison(_TwoSides):
    """One phase (``attribution.CATEGORIES``): allocations, their bytes and the bytes live
    at each side's peak, and the request sizes whose counts differ."""

    name: str
    hits_a: int
    hits_b: int
    allocated_a: int
    allocated_b: int
    at_peak_a: int
    at_peak_b: int
    sizes: tuple[SizeDifference, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sizes": [s.to_dict() for s in self.sizes]}


@dataclass(frozen=True)
class SnapshotComparison:
    """A whole comparison; sizes in bytes. ``name_a``/``name_b``: how the two are called;
    ``source_a``/``source_b``: their files; ``entries_*``: trace entries (0: none, the
    figures are the blocks in use); ``peak_*``/``max_reserved_*``/``final_allocated_*``:
    each analysis's peak allocated, highest reserved and allocated bytes at the end;
    ``lines``: largest ``difference`` first; ``matched``: lines both sides have."""

    name_a: str
    name_b: str
    source_a: str
    source_b: str
    entries_a: int
    entries_b: int
    peak_a: int
    peak_b: int
    max_reserved_a: int
    max_reserved_b: int
    final_allocated_a: int
    final_allocated_b: int
    phases: tuple[PhaseComparison, ...]
    lines: tuple[LineComparison, ...]
    matched: int

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(phases=[p.to_dict() for p in self.phases], lines=[line.to_dict() for line in self.lines])
        return {"format": "gpu_mem_track snapshot comparison", "version": 1, **data}


def compare_analyses(
    a: Mapping[str, Any], b: Mapping[str, Any], name_a: str = "A", name_b: str = "B"
) -> SnapshotComparison:
    """Compare two analyses (``SnapshotAnalysis.to_dict()``); ``UsageError`` (one line)
    when one is not such an analysis."""
    try:
        return _compare(a, b, name_a, name_b)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"not a snapshot analysis that can be compared ({exc!r})") from None


def _compare(a: Mapping[str, Any], b: Mapping[str, Any], name_a: str, name_b: str) -> SnapshotComparison:
    all_a, all_b = _files(a), _files(b)
    files = match_files(all_a, all_b)
    shown = {fa: _shown(fa, fb, all_a) for fa, fb in files.items()}
    lines_a, lines_b = _lines(a), _lines(b)
    sizes_a, sizes_b = _line_sizes(a), _line_sizes(b)
    by_file_b = {fb: fa for fa, fb in files.items()}
    keys_b = {(by_file_b.get(f, f"\0b{f}"), fn, n): (f, fn, n) for f, fn, n in lines_b}
    keys_a = {(f if f in files else f"\0a{f}", fn, n): (f, fn, n) for f, fn, n in lines_a}
    rows = []
    for key in {**keys_a, **keys_b}:
        in_a, in_b = keys_a.get(key), keys_b.get(key)
        ua, ub = lines_a.get(in_a, {}), lines_b.get(in_b, {})
        file_a, file_b = in_a[0] if in_a else "", in_b[0] if in_b else ""
        # a line only B has, of a file both have, is shown as that file's other lines are
        where = shown.get(file_a or by_file_b.get(file_b, "")) or (
            _shown(file_a, "", all_a) if file_a else _shown(file_b, "", all_b)
        )
        function, line = key[1], key[2]
        fa, fb = _figures(ua), _figures(ub)
        rows.append(
            LineComparison(
                where=f"{where}:{line} {function}".strip() if line else f"{where} {function}".strip(),
                file_a=file_a, file_b=file_b, function=function, line=line,
                code=_code(ua) or _code(ub), phase_a=ua.get("category", ""), phase_b=ub.get("category", ""),
                hits_a=fa.hits, hits_b=fb.hits, allocated_a=fa.allocated, allocated_b=fb.allocated,
                at_peak_a=fa.at_peak, at_peak_b=fb.at_peak,
                sizes=size_differences(sizes_a.get(in_a, Counter()), sizes_b.get(in_b, Counter())),
            )
        )  # fmt: skip
    rows.sort(key=lambda r: (-r.difference, -max(r.allocated_a, r.allocated_b), r.where))
    return SnapshotComparison(
        name_a, name_b, str(a["source"]), str(b["source"]), int(a["entries"]), int(b["entries"]),
        int(a["peak"]["allocated"]), int(b["peak"]["allocated"]), int(a["max_reserved"]),
        int(b["max_reserved"]), int(a["final_allocated"]), int(b["final_allocated"]),
        _phases(a, b), tuple(rows), sum(1 for r in rows if r.file_a and r.file_b),
    )  # fmt: skip


def match_files(files_a: Iterable[str], files_b: Iterable[str]) -> dict[str, str]:
    """Each file of A matched to one of B (see the module docstring): same name, the pair
    agreeing on the most trailing path parts first; pseudo-sites (``<...>``) by text."""
    a, b = sorted(set(files_a)), sorted(set(files_b))
    pairs = []
    for fa in a:
        for fb in b:
            score = _common_tail(fa, fb)
            if score:
                pairs.append((-score, fa, fb))
    out: dict[str, str] = {}
    taken: set[str] = set()
    for _, fa, fb in sorted(pairs):
        if fa not in out and fb not in taken:
            out[fa] = fb
            taken.add(fb)
    return out


def size_differences(a: Counter[int], b: Counter[int]) -> tuple[SizeDifference, ...]:
    """The request sizes whose counts differ, largest difference in bytes first."""
    out = [SizeDifference(size, a[size], b[size]) for size in set(a) | set(b) if a[size] != b[size]]
    return tuple(sorted(out, key=lambda d: (-abs(d.bytes), -d.size)))


def _parts(path: str) -> list[str]:
    return [p for p in path.replace("\\", "/").split("/") if p and p != "."]


def _common_tail(fa: str, fb: str) -> int:
    """How many trailing path parts two files share (0: another name; a pseudo-site
    matches only itself)."""
    if fa.startswith("<") or fb.startswith("<"):
        return 1 if fa == fb else 0
    pa, pb = _parts(fa), _parts(fb)
    n = 0
    while n < min(len(pa), len(pb)) and pa[-1 - n] == pb[-1 - n]:
        n += 1
    return n


def _shown(fa: str, fb: str, side: Iterable[str]) -> str:
    """A file as both paths agree on it (its name and the folders they share), and at
    least as much as tells it from the other files of its side."""
    if fa.startswith("<"):
        return fa
    parts = _parts(fa)
    unique = max((_common_tail(fa, other) + 1 for other in side if other != fa), default=1)
    keep = max(_common_tail(fa, fb) if fb else 0, unique, 1)
    return fa if keep >= len(parts) else "/".join(parts[len(parts) - keep :])  # whole: as recorded


def _files(analysis: Mapping[str, Any]) -> set[str]:
    return {str(u["file"]) for u in analysis["lines"]}


def _lines(analysis: Mapping[str, Any]) -> dict[tuple[str, str, int], Mapping[str, Any]]:
    return {(str(u["file"]), str(u["function"]), int(u["line"])): u for u in analysis["lines"]}


def _line_sizes(analysis: Mapping[str, Any]) -> dict[tuple[str, str, int], Counter[int]]:
    out: dict[tuple[str, str, int], Counter[int]] = {}
    for s in analysis.get("sizes", ()):
        counts = out.setdefault((str(s["file"]), str(s["function"]), int(s["line"])), Counter())
        for size, count in s["counts"]:
            counts[int(size)] += int(count)
    return out


def _figures(usage: Mapping[str, Any] | None) -> _Figures:
    if not usage:
        return _Figures()
    return _Figures(int(usage["hits"]), int(usage["allocated"]), int(usage["live_at_peak"]))


def _code(usage: Mapping[str, Any]) -> str:
    code = str(usage.get("code", ""))
    return "" if code.startswith("<line") else code


def _phases(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[PhaseComparison, ...]:
    pa = {c["name"]: c for c in a["categories"]}
    pb = {c["name"]: c for c in b["categories"]}
    sizes_a, sizes_b = _phase_sizes(a), _phase_sizes(b)
    rows = []
    for name in {**pa, **pb}:
        fa, fb = _figures(pa.get(name)), _figures(pb.get(name))
        sizes = size_differences(sizes_a.get(name, Counter()), sizes_b.get(name, Counter()))
        rows.append(
            PhaseComparison(name, fa.hits, fb.hits, fa.allocated, fb.allocated, fa.at_peak, fb.at_peak, sizes)
        )
    return tuple(sorted(rows, key=lambda p: (-p.difference, p.name)))


def _phase_sizes(analysis: Mapping[str, Any]) -> dict[str, Counter[int]]:
    out: dict[str, Counter[int]] = {}
    for s in analysis.get("sizes", ()):
        counts = out.setdefault(str(s["phase"]), Counter())
        for size, count in s["counts"]:
            counts[int(size)] += int(count)
    return out
