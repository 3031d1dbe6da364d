"""The caching allocator's constants, its settings, and the pure size rules.

Facts from PyTorch's ``c10/cuda/CUDACachingAllocator.cpp`` and its allocator config
(``c10/core/AllocatorConfig.cpp``); all sizes in bytes. Settings come from a
``PYTORCH_CUDA_ALLOC_CONF`` string (``parse_alloc_conf``) or from a memory snapshot's
``allocator_settings`` (``settings_from_snapshot``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import UsageError

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorSettings",
    "allocation_size",
    "parse_alloc_conf",
    "round_size",
    "settings_from_snapshot",
]

MIB = 1 << 20
K_MIN_BLOCK_SIZE = 512  #: every block is a multiple of this
K_SMALL_SIZE = MIB  #: largest request served by the small pool
K_SMALL_BUFFER = 2 * MIB  #: segment size of the small pool (and its expandable page)
K_MIN_LARGE_ALLOC = 10 * MIB  #: requests under this share 20 MiB segments
K_ROUND_LARGE = 2 * MIB  #: larger requests get a segment rounded up to this
K_LARGE_BUFFER = 20 * MIB  #: shared large segment (and the large pool's expandable page)

#: ``roundup_power2_divisions`` has one entry per power-of-two interval from 1 MiB
#: (entry 0 also covers everything below) to 32 GiB (entry 15 also covers above).
INTERVALS = 16
_INTERVAL_START_LOG2 = 20


@dataclass(frozen=True)
class AllocatorSettings:
    """The settings that change the allocator's decisions.

    ``max_split_size``: blocks at least this large are never split, and serve only
    requests at least this large that they exceed by under ``max_non_split_rounding_size``
    (None: no limit, the default). ``roundup_power2_divisions``: 16 division counts, one per
    power-of-two size interval from 1 MiB (0 or 1: round to 512 B only).
    ``expandable_segments``: one growing segment per stream and pool, mapped in 2 MiB
    (small pool) or 20 MiB (large pool) pages. ``garbage_collection_threshold``: under a
    memory fraction (``set_per_process_memory_fraction``) only, once the reserved bytes
    pass this share of the allowed bytes, cached whole blocks of the large pool are freed
    oldest first before a new segment is asked for (``recovery``).
    """

    max_split_size: int | None = None
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * INTERVALS)
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0

    def divisions_for(self, size: int) -> int:
        """The division count that applies to a request of ``size`` bytes."""
        index = size.bit_length() - 1 - _INTERVAL_START_LOG2
        return self.roundup_power2_divisions[min(max(index, 0), INTERVALS - 1)]

    @property
    def split_limit(self) -> float:
        """``max_split_size`` with no limit as infinity (comparisons stay simple)."""
        return float("inf") if self.max_split_size is None else self.max_split_size

    def unsplit_slack(self, rounded: int) -> int:
        """The most bytes a block may exceed the rounded request (``rounded`` bytes) it
        serves: 1 MiB under ``split_limit`` (a split leaves only larger remainders), else
        ``max_non_split_rounding_size`` but at least 2 MiB (an oversize block is whole)."""
        if rounded < self.split_limit:
            return K_SMALL_SIZE
        return max(self.max_non_split_rounding_size, K_ROUND_LARGE)

    def conf_string(self) -> str:
        """These settings as a ``PYTORCH_CUDA_ALLOC_CONF`` value (``""`` for the defaults)."""
        parts = []
        if self.max_split_size is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size // MIB}")
        if self.max_non_split_rounding_size != K_LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MIB}")
        if any(self.roundup_power2_divisions):
            items = ",".join(f"{1 << i}:{d}" for i, d in enumerate(self.roundup_power2_divisions))
            parts.append(f"roundup_power2_divisions:[{items}]")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["roundup_power2_divisions"] = list(self.roundup_power2_divisions)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AllocatorSettings:
        return cls(
            data.get("max_split_size"),
            int(data.get("max_non_split_rounding_size", K_LARGE_BUFFER)),
            tuple(int(d) for d in data.get("roundup_power2_divisions", (0,) * INTERVALS)),
            bool(data.get("expandable_segments", False)),
            float(data.get("garbage_collection_threshold", 0.0)),
        )


def round_size(size: int, settings: AllocatorSettings | None = None) -> int:
    """The block size a request of ``size`` bytes is rounded to (before any unsplit
    remainder): at least 512 B, a multiple of 512 B, or the next power-of-two division
    when ``roundup_power2_divisions`` applies to its interval."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = settings.divisions_for(size) if settings else 0
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return _next_division(size, divisions)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def _next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def allocation_size(rounded: int) -> int:
    """The segment a rounded request gets when no cached block fits: 2 MiB for the
    small pool (<= 1 MiB), 20 MiB under 10 MiB, else the request rounded up to 2 MiB."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


def _lex(text: str) -> list[str]:
    tokens, word = [], ""
    for ch in text:
        if ch in ",:[]":
            if word:
                tokens.append(word)
                word = ""
            tokens.append(ch)
        elif ch != " ":
            word += ch
    if word:
        tokens.append(word)
    return tokens


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items = _lex(text)
        self.i = 0

    def fail(self, problem: str) -> None:
        raise UsageError(f"PYTORCH_CUDA_ALLOC_CONF {self.text!r}: {problem}")

    def take(self, expected: str | None = None) -> str:
        if self.i >= len(self.items):
            self.fail(f"expected {repr(expected) if expected else 'a value'} at the end")
        token = self.items[self.i]
        self.i += 1
        if expected is not None and token != expected:
            self.fail(f"expected {expected!r}, found {token!r}")
        return token

    def peek(self) -> str | None:
        return self.items[self.i] if self.i < len(self.items) else None

    def number(self, key: str, kind: type = int) -> Any:
        token = self.take()
        try:
            return kind(token)
        except ValueError:
            self.fail(f"{key} needs a number, not {token!r}")

    def boolean(self, key: str) -> bool:
        token = self.take()
        if token not in ("True", "False"):
            self.fail(f"{key} needs True or False, not {token!r}")
        return token == "True"


def parse_alloc_conf(text: str, base: AllocatorSettings | None = None) -> AllocatorSettings:
    """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` value (``key:value`` pairs, comma-separated)
    on top of ``base`` (default settings if None). Options that only concern pinned
    host memory or locking are accepted and ignored; unknown keys and bad values raise
    ``UsageError``; ``backend:cudaMallocAsync`` too (a different allocator)."""
    settings = base or AllocatorSettings()
    tokens = _Tokens(text)
    while tokens.peek() is not None:
        key = tokens.take()
        tokens.take(":")
        settings = _apply(tokens, key, settings)
        if tokens.peek() is not None:
            tokens.take(",")
    return settings


_IGNORED = {
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
}


def _apply(tokens: _Tokens, key: str, settings: AllocatorSettings) -> AllocatorSettings:
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        mb = tokens.number(key)
        if mb < K_LARGE_BUFFER // MIB:
            tokens.fail(f"{key} must be at least {K_LARGE_BUFFER // MIB}")
        name = "max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding_size"
        return replace(settings, **{name: mb * MIB})
    if key == "roundup_power2_divisions":
        return replace(settings, roundup_power2_divisions=_divisions(tokens))
    if key == "expandable_segments":
        return replace(settings, expandable_segments=tokens.boolean(key))
    if key == "garbage_collection_threshold":
        value = tokens.number(key, float)
        if not 0.0 < value < 1.0:
            tokens.fail("garbage_collection_threshold must be in (0.0, 1.0)")
        return replace(settings, garbage_collection_threshold=value)
    if key == "backend":
        if tokens.take() != "native":
            tokens.fail("only the native caching allocator is modelled (not cudaMallocAsync)")
        return settings
    if key in _IGNORED:
        tokens.take()
        return settings
    tokens.fail(f"unknown option {key!r}")
    return settings


def _power_of_two(tokens: _Tokens, value: int, what: str) -> None:
    if value <= 0 or value & (value - 1):
        tokens.fail(f"roundup_power2_divisions: {what} must be a power of 2, not {value}")


def _divisions(tokens: _Tokens) -> tuple[int, ...]:
    if tokens.peek() != "[":
        value = tokens.number("roundup_power2_divisions")
        _power_of_two(tokens, value, "the division count")
        return (value,) * INTERVALS
    tokens.take("[")
    table = [0] * INTERVALS
    first, last = True, 0
    while tokens.peek() != "]":
        bound = tokens.take()
        tokens.take(":")
        value = tokens.number("roundup_power2_divisions")
        if value:
            _power_of_two(tokens, value, "a division count")
        if bound == ">":
            table[last:] = [value] * (INTERVALS - last)
        else:
            try:
                mb = int(bound)
            except ValueError:
                tokens.fail(f"roundup_power2_divisions: bad interval {bound!r}")
            _power_of_two(tokens, mb, "an interval (MiB)")
            index = min(mb.bit_length() - 1, INTERVALS - 1)
            if first:
                table[:index] = [value] * index
                first = False
            table[index] = value
            last = index
        if tokens.peek() != "]":
            tokens.take(",")
    tokens.take("]")
    return tuple(table)


def settings_from_snapshot(data: dict[str, Any]) -> AllocatorSettings:
    """Settings from a snapshot's ``allocator_settings`` (empty: the defaults). The
    explicit values win over the ``PYTORCH_CUDA_ALLOC_CONF`` string recorded beside them,
    which supplies only what they omit (``max_non_split_rounding_mb``)."""
    settings = AllocatorSettings()
    conf = data.get("PYTORCH_CUDA_ALLOC_CONF") or data.get("last_allocator_settings")
    if isinstance(conf, str) and conf.strip():
        settings = parse_alloc_conf(conf)
    split = data.get("max_split_size")
    if split is not None:
        split = int(split)
        settings = replace(settings, max_split_size=split if 0 < split < 1 << 63 else None)
    divisions = data.get("roundup_power2_divisions")
    if isinstance(divisions, dict):
        table = [0] * INTERVALS
        for mb, value in divisions.items():
            table[min(int(mb).bit_length() - 1, INTERVALS - 1)] = int(value)
        settings = replace(settings, roundup_power2_divisions=tuple(table))
    elif isinstance(divisions, (list, tuple)) and len(divisions) == INTERVALS:
        settings = replace(settings, roundup_power2_divisions=tuple(int(d) for d in divisions))
    if "expandable_segments" in data:
        settings = replace(settings, expandable_segments=bool(data["expandable_segments"]))
    if "garbage_collection_threshold" in data:
        settings = replace(settings, garbage_collection_threshold=float(data["garbage_collection_threshold"]))
    return settings
