"""Byte arithmetic shared by every layer: IEC formatting, parsing, CUDA block rounding."""

from __future__ import annotations

import re

__all__ = [
    "CUDA_BLOCK",
    "counted",
    "cuda_block_bytes",
    "format_bytes",
    "format_peak",
    "parse_bytes",
    "shape_text",
]

#: The CUDA caching allocator hands out blocks in multiples of 512 bytes.
CUDA_BLOCK = 512

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SUFFIX = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator reserves for a storage of ``nbytes``.

    Every non-empty block is rounded up to a multiple of 512 B (so a 4-byte tensor
    holds 512 B of allocated memory); an empty storage allocates nothing.
    """
    if nbytes <= 0:
        return 0
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


def format_bytes(nbytes: int | None, signed: bool = False) -> str:
    """Format a byte count in IEC units, correctly rounded to two decimals.

    Plain bytes print as integers (``"512 B"``); larger counts use the largest unit
    whose rounded value stays below 1024 (``"548.05 MiB"``, ``"1.05 GiB"``).
    ``None`` (unknown) prints as ``"n/a"``. With ``signed`` a ``+`` precedes
    non-negative values.
    """
    if nbytes is None:
        return "n/a"
    sign = "-" if nbytes < 0 else ("+" if signed else "")
    magnitude = abs(int(nbytes))
    if magnitude < 1024:
        return f"{sign}{magnitude} B"
    for power, unit in enumerate(_UNITS):
        text = f"{magnitude / 1024**power:.2f}"
        if float(text) < 1024 or power == len(_UNITS) - 1:
            if power == 0:
                continue
            return f"{sign}{text} {unit}"
    raise AssertionError("unreachable")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun`` in agreement: ``counted(1, "more row")`` is ``"1 more row"``,
    2 or 0 give ``"2 more rows"``, ``"0 more rows"``. ``plural``: the plural form when it
    is not ``noun + "s"``."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"


def format_peak(nbytes: int, exact: bool) -> str:
    """A peak as ``format_bytes`` prints it, prefixed ``>=`` when it is only a lower bound
    (see ``lines.LineRecord.peak_exact``)."""
    return format_bytes(nbytes) if exact else ">=" + format_bytes(nbytes)


def parse_bytes(text: str) -> int:
    """Parse ``"64MiB"``, ``"1.5 GB"``, ``"512"`` into bytes (decimal and IEC suffixes).

    Raises ``ValueError`` naming the text when it is not a size.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _SUFFIX:
        raise ValueError(f"not a byte size: {text!r} (examples: 512, 64MiB, 1.5GB)")
    return int(round(float(match.group(1)) * _SUFFIX[match.group(2).lower()]))


def shape_text(shape: tuple[int, ...]) -> str:
    """A shape as reports spell it (CSV, HTML, notebooks): ``2x3``, or ``scalar`` for ``()``."""
    return "x".join(map(str, shape)) if shape else "scalar"
