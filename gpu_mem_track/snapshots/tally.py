"""Sums of a snapshot analysis: one walk through the replayed steps (or the blocks in use
of a snapshot without a trace) gives each site's and each phase's ``usage`` records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..allocator.replay import Replay
from ..allocator.timeline import Step
from .attribution import PRE_TRACE, Attributor, Site
from .phases import TraceReading
from .usage import AllocationSizes, CategoryUsage, LineUsage, source_code

__all__ = ["Tally"]


class Tally:
    """Per-site and per-category sums over one walk through the steps."""

    def __init__(self, attributor: Attributor) -> None:
        self.attributor = attributor
        self.sites: dict[Site, dict[str, Any]] = {}
        self.phases: dict[str, list[int]] = {}
        self.requests: dict[tuple[Site, str], Counter[int]] = {}

    def row(self, site: Site) -> dict[str, Any]:
        row = self.sites.get(site)
        if row is None:
            row = self.sites[site] = dict.fromkeys(
                ("hits", "allocated", "freed", "at_peak", "at_end", "memory", "peak"), 0
            )
            row["by_category"] = {}
        return row

    def walk(self, replayed: Replay, peak_at: int | None, reading: TraceReading) -> None:
        """Sum the steps; ``reading``: the trace read in order (``phases.read_trace``:
        each entry's phase, and the line of entries without frames)."""
        live: dict[int, tuple[int, Site, str]] = {
            a: (s, PRE_TRACE, "before recording") for a, s in replayed.start_blocks
        }
        pre = self.row(PRE_TRACE)
        pre.update(hits=len(live), allocated=replayed.start_allocated, memory=replayed.start_allocated)
        pre.update(peak=replayed.start_allocated)
        self.phases["before recording"] = [len(live), replayed.start_allocated, 0]
        if peak_at is None:
            self.mark(live.values(), "at_peak")
        for position, step in enumerate(replayed.steps):
            action = step.entry.action
            if action == "alloc":
                site = reading.site(step.index, step.entry.frames, self.attributor)
                category = reading.phases[step.index]
                self.allocation(site, category, step)
                self.request(site, category, step.entry.size)
                live[step.entry.addr] = (step.bytes, site, category)
            elif action == "free_requested":
                site = reading.site(step.index, step.entry.frames, self.attributor)
                row = self.row(site)
                row["freed"] -= step.bytes
                row["memory"] = step.allocated
                live.pop(step.entry.addr, None)
            if position == peak_at:
                self.mark(live.values(), "at_peak")
        self.mark(live.values(), "at_end")

    def allocation(self, site: Site, category: str, step: Step) -> None:
        row = self.row(site)
        row["hits"] += 1
        row["allocated"] += step.bytes
        row["memory"] = step.allocated
        row["peak"] = max(row["peak"], step.allocated)
        row["by_category"][category] = row["by_category"].get(category, 0) + step.bytes
        phase = self.phases.setdefault(category, [0, 0, 0])
        phase[0] += 1
        phase[1] += step.bytes

    def request(self, site: Site, category: str, size: int) -> None:
        counts = self.requests.get((site, category))
        if counts is None:
            counts = self.requests[(site, category)] = Counter()
        counts[size] += 1

    def block(self, site: Site, category: str, size: int, allocated: int, requested: int) -> None:
        """A block in use at the end of a snapshot without a trace (``requested`` bytes)."""
        self.request(site, category, requested)
        row = self.row(site)
        row["hits"] += 1
        for key in ("allocated", "at_peak", "at_end"):
            row[key] += size
        row.update(memory=allocated, peak=allocated)
        row["by_category"][category] = row["by_category"].get(category, 0) + size
        phase = self.phases.setdefault(category, [0, 0, 0])
        phase[0] += 1
        phase[1] += size
        phase[2] += size

    def mark(self, blocks: Iterable[tuple[int, Site, str]], key: str) -> None:
        for size, site, category in blocks:
            self.row(site)[key] += size
            if key == "at_peak":
                self.phases.setdefault(category, [0, 0, 0])[2] += size

    def lines(self) -> tuple[LineUsage, ...]:
        out = []
        for site, row in self.sites.items():
            if site == PRE_TRACE and not row["hits"]:
                continue
            categories = row["by_category"]
            category = max(categories, key=categories.get) if categories else "before recording"
            out.append(
                LineUsage(
                    site.file, site.function, site.line, source_code(site.file, site.line), category,
                    row["hits"], row["allocated"], row["freed"], row["at_peak"], row["at_end"],
                    row["memory"], row["peak"],
                )
            )  # fmt: skip
        return tuple(sorted(out, key=lambda u: (-u.live_at_peak, -u.allocated, u.file, u.line)))

    def sizes(self) -> tuple[AllocationSizes, ...]:
        out = [
            AllocationSizes(
                site.file, site.function, site.line, phase, tuple(sorted(counts.items(), reverse=True))
            )
            for (site, phase), counts in self.requests.items()
        ]
        return tuple(sorted(out, key=lambda s: (s.file, s.line, s.function, s.phase)))

    def categories(self) -> tuple[CategoryUsage, ...]:
        usages = [CategoryUsage(name, *figures) for name, figures in self.phases.items() if any(figures)]
        return tuple(sorted(usages, key=lambda c: (-c.live_at_peak, -c.allocated, c.name)))
