"""The allocator check's verdict on a replay (``replay``): every recorded decision
against the model's (``ReplayReport``), and the first ones that differ (``Mismatch``)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from .tally import Tally

__all__ = ["Mismatch", "ReplayReport"]


@dataclass(frozen=True)
class Mismatch:
    """Where the prediction left the record: the event index, what was compared
    (``alloc address``, ``segments``, ``oom``, ``free``), recorded and predicted."""

    index: int
    what: str
    recorded: str
    predicted: str


@dataclass(frozen=True)
class ReplayReport:
    """The outcome of a replay (all counts; bytes where named).

    ``allocs``: recorded allocations, those replayed, those placed at torch's address.
    ``segment_allocs``/``segment_frees``: recorded, predicted, and matched (same call,
    address and size). ``ooms``: recorded, predicted, matched. ``final_segments`` /
    ``final_blocks``: the end state, recorded vs simulated, matched when equal (address,
    size, type; blocks: address, size, state, and request when live). ``tails``:
    start-state blocks whose unsplit remainder the trace had to settle; of them ``pinned``
    by a block start seen at their end, ``inferred`` from a replayed best-fit decision,
    the rest taken as having none. ``rounds``: replays run (one more per inference).
    ``mismatches``: the first ones, in order. ``peak_allocated``/``peak_reserved``: the
    simulated peaks over the replay (bytes). ``started_mid_call``: the trace begins with
    an allocation whose ``segment_alloc`` the ring buffer dropped (inferred; not counted).
    """

    source: str
    device: int
    events: int
    settings: str
    start_segments: int
    start_live_blocks: int
    tails: int
    pinned: int
    inferred: int
    rounds: int
    allocs: Tally
    segment_allocs: Tally
    segment_frees: Tally
    empty_cache_calls: int
    ooms: Tally
    final_segments: Tally
    final_blocks: Tally
    unsupported_events: int
    peak_allocated: int
    peak_reserved: int
    mismatch_count: int
    mismatches: tuple[Mismatch, ...] = ()
    problems: tuple[str, ...] = ()
    started_mid_call: bool = False

    @property
    def all_match(self) -> bool:
        """Every recorded decision predicted and nothing more."""
        tallies = (self.allocs, self.segment_allocs, self.segment_frees, self.ooms)
        return (
            all(t.exact for t in tallies)
            and self.final_segments.exact
            and self.final_blocks.exact
            and not self.mismatch_count
            and not self.problems
            and not self.unsupported_events
        )

    def to_dict(self) -> dict:
        out = asdict(self)
        out["all_match"] = self.all_match
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ReplayReport:
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        for name in ("allocs", "segment_allocs", "segment_frees", "ooms", "final_segments", "final_blocks"):
            values[name] = Tally(**values[name])
        values["mismatches"] = tuple(Mismatch(**m) for m in values.get("mismatches", ()))
        values["problems"] = tuple(values.get("problems", ()))
        return cls(**values)
