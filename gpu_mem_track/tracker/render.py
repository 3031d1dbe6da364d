"""Text rendering of stamps: the familiar MemTracker report, done right.

Renderers take records and return strings; they never measure, print or open files.
A stamp renders as its stamp line, the ledger line, the categories line, then (with
``detail``) one ``+``/``-`` line per changed tensor group, in that order::

    At vgg_demo.py:50 main [model on device] | cuda:0 | tensors 548.07 MiB | allocated ...
      ledger: tensors 548.07 MiB + hidden 0 B = allocated ...; + allocator cache ... = reserved ...
      categories: parameter 548.05 MiB | other 16.00 KiB | hidden 0 B | allocator cache ... = driver ...
    + | 1 * Size:(4096, 25088) | Memory: 392.00 MiB | Parameter | float32 | classifier.0.weight
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from ..units import format_bytes
from .records import CATEGORY_LABELS, Census, GroupChange, Ledger, ProbeResult, Skipped, Stamp

__all__ = [
    "MAX_NAMES",
    "one_line",
    "render_census",
    "render_header",
    "render_probe",
    "render_stamp",
    "render_stamps",
]

#: Names listed per change line before the rest are summarised as "... (+N more)".
MAX_NAMES = 3


def one_line(text: str) -> str:
    """``text`` with each unprintable character (newline, tab, escape, ...) written as its
    Python escape (``\\n``, ``\\t``, ``\\x1b``), so a label cannot break a report line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def render_header(run_name: str, device: str, versions: str) -> str:
    """The first line of a text log: run, device and versions."""
    return f"# gpu_mem_track run {run_name} | device {device} | {versions}\n"


def render_stamp(stamp: Stamp, detail: bool = True) -> str:
    """One stamp as text, newline-terminated. ``detail=False`` leaves out the change lines."""
    lines = [_stamp_line(stamp), "  " + _ledger_line(stamp.ledger)]
    if stamp.ledger.categories is not None:
        lines.append("  " + _categories_line(stamp.ledger))
    notes = _notes(stamp.skipped, stamp.views)
    if notes:
        lines.append("  " + notes)
    if detail:
        lines.extend(_change_lines(stamp.changes))
    return "\n".join(lines) + "\n"


def render_stamps(stamps: Iterable[Stamp], detail: bool = True) -> str:
    """Several stamps, in order, as one text."""
    return "".join(render_stamp(stamp, detail) for stamp in stamps)


def _stamp_line(stamp: Stamp) -> str:
    where = f"At {os.path.basename(stamp.file)}:{stamp.line} {stamp.function}"
    if stamp.label:
        where += f" [{one_line(stamp.label)}]"
    ledger = stamp.ledger
    parts = [where, ledger.device, f"tensors {format_bytes(ledger.tensors)}"]
    if ledger.device.startswith("cuda"):
        parts.append(f"allocated {format_bytes(ledger.allocated)}")
        parts.append(f"reserved {format_bytes(ledger.reserved)}")
        driver = format_bytes(ledger.driver)
        if ledger.driver_source == "nvml device-wide":
            driver += " (device-wide)"
        parts.append(f"driver {driver}")
    else:
        parts.append(f"process RSS {format_bytes(ledger.rss)}")
    return " | ".join(parts)


def _ledger_line(ledger: Ledger) -> str:
    if not ledger.device.startswith("cuda"):
        return (
            f"ledger: CPU tensors {format_bytes(ledger.tensors)} of process RSS "
            f"{format_bytes(ledger.rss)} (no allocator statistics on CPU)"
        )
    if ledger.allocated is None:
        return f"ledger: tensors {format_bytes(ledger.tensors)}; CUDA not initialised by the program"
    text = (
        f"ledger: tensors {format_bytes(ledger.tensors)} + hidden {format_bytes(ledger.hidden)}"
        f" = allocated {format_bytes(ledger.allocated)}"
        f"; + allocator cache {format_bytes(ledger.cache)} = reserved {format_bytes(ledger.reserved)}"
    )
    if ledger.framework is not None:
        text += f"; + framework {format_bytes(ledger.framework)}"
        if ledger.context is not None:
            text += (
                f" (CUDA context {format_bytes(ledger.context)}, "
                f"libraries and other {format_bytes(ledger.framework_other)})"
            )
        text += f" = driver {format_bytes(ledger.driver)}"
        if ledger.driver_source == "nvml device-wide":
            text += " (device-wide: includes other processes)"
    text += f" | peak allocated {format_bytes(ledger.peak_allocated)}"
    return text


def _categories_line(ledger: Ledger) -> str:
    """Non-zero categories, then hidden, allocator cache and framework where known (even
    when 0), and the figure they add up to."""
    categories = set(CATEGORY_LABELS.values())
    parts = [
        f"{name} {format_bytes(nbytes)}"
        for name, nbytes in ledger.breakdown().items()
        if nbytes or name not in categories
    ]
    return f"categories: {' | '.join(parts) or 'none'} = {ledger.total_name} {format_bytes(ledger.total)}"


def _notes(skipped: Sequence[Skipped], views: int) -> str:
    notes = [
        f"{s.count} {s.reason} tensor{'s' if s.count != 1 else ''}"
        + (f" ({format_bytes(s.nominal_bytes)} nominal)" if s.nominal_bytes else "")
        for s in skipped
    ]
    text = f"not counted: {', '.join(notes)}" if notes else ""
    if views:
        text += ("; " if text else "") + f"{views} view{'s' if views != 1 else ''} of counted storages"
    return text


def _change_lines(changes: Sequence[GroupChange]) -> list[str]:
    if not changes:
        return []
    cells = [
        (
            change.sign,
            f"{abs(change.count_delta)} * Size:{_shape(change.shape)}",
            f"Memory: {format_bytes(abs(change.bytes_delta))}",
            change.kind,
            change.dtype,
            _names(change.names),
        )
        for change in changes
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(5)]
    lines = []
    for row in cells:
        padded = [row[0]] + [cell.ljust(width) for cell, width in zip(row[1:5], widths[1:])]
        line = " | ".join(padded)
        lines.append((line + " | " + row[5]) if row[5] else line.rstrip())
    return lines


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(one_line(name) for name in names[:MAX_NAMES])
    return shown if len(names) <= MAX_NAMES else shown + f", ... (+{len(names) - MAX_NAMES} more)"


def render_census(census: Census) -> str:
    """Every live group of a census (``=`` lines), for ``verbosity=2``."""
    lines = []
    for group in census.groups:
        lines.append(
            f"= | {group.count} * Size:{_shape(group.shape)} | Memory: {format_bytes(group.nbytes)}"
            f" | {group.kind} | {group.dtype}" + (f" | {_names(group.names)}" if group.names else "")
        )
    return "\n".join(lines) + ("\n" if lines else "")


def render_probe(result: ProbeResult) -> str:
    """The probe's stages and the framework cost of each, as a small table."""
    costs = result.costs()
    header = (
        f"CUDA framework cost on {result.device} ({result.gpu_name}); driver memory from "
        f"{result.driver_source}; torch {result.torch_version}\n"
    )
    rows = [("stage", "driver", "allocator reserved", "cost outside the allocator")]
    for stage in result.stages:
        cost = costs.get(stage.name)
        rows.append(
            (
                stage.name,
                format_bytes(stage.driver),
                format_bytes(stage.reserved),
                "" if cost is None else format_bytes(cost),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    body = "".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in rows)
    return header + body + f"  framework cost in all: {format_bytes(result.total)}\n"
