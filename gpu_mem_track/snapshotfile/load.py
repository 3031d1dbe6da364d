"""Read a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``) safely.

A snapshot is a pickle of plain dicts, lists, strings, numbers, booleans and None,
often gzip-compressed (told by its magic bytes, whatever the file is called). It is
read with an unpickler that refuses every global, so a file asking to import anything
is rejected before anything runs. Every problem (empty, truncated, not a pickle, the
wrong shape, a missing key) raises ``errors.BadInput`` (a ``UsageError``) with one line naming the file and
the problem. Unknown keys are ignored; optional ones may be missing.

Bounded (see ``inputs``): only regular files are read, at most ``max_bytes`` of them
(default ``MAX_BYTES``), and gunzipped to at most as many (``errors.TooLarge`` past
it). The file is unpickled as a stream (``stream.SnapshotStream``: read and gunzipped a
chunk at a time as the unpickler asks, never whole in memory), so a file that is not a
pickle, such as a gzip bomb of zeros, is refused within its first chunk; no single value
(a string, a pickle frame) may be longer than ``MAX_VALUE``. A valid pickle that is no
snapshot (``[0] * 200_000_000``, a dict repeated by memo references, deep nesting) is
bounded too: while the C unpickler builds the value, the resident set is read at every
chunk (``guard``), and once it has grown by ``memory_budget`` bytes (``MEMORY_BUDGET``,
384 MiB) the unpickler is stopped, what it built is dropped, and the file is read again
by ``scan``, which checks the shape of a snapshot opcode by opcode while building
nothing (its memory is bounded whatever the file holds; see ``scan`` and ``shape``): a
file that is not a snapshot's is refused in one line naming the place
(``segments[0] is an int, not a segment``): refusing a file peaks at about the budget
(twice it at most, where a dict grows its table as the budget is crossed), under 1 GiB. A
file that passes is unpickled once more, unbounded: a real snapshot that large takes
4-8 bytes of memory per byte of pickle, and about twice the time of a plain load
(the scan is pure Python; ``scripts/bench/bench_snapshot_load.py``). Past the budget the
scan is stricter than the loader in one way: a list or dict under a key the loader
reads in other records only (a segment's ``history``) is refused. After the pickle the
rest of the file is read through, keeping nothing, so the bounds and the gzip checks hold
for all of it. Every size, address and stream must lie in ``[0, 2**64)``, every time in
``[0, 2**53)`` microseconds, line numbers and devices in ``[0, 2**31)``, and the
settings nest at most ``inputs.MAX_DEPTH`` deep with integers of at most 64 bits. Names
that are not valid UTF-8 (bytes, lone surrogates) are kept with their bad bytes written
as ``\\xNN`` escapes. Every failure is ``errors.BadInput``.

Shapes accepted: the dict torch writes (``segments``, ``device_traces``,
``allocator_settings``; the last two may be absent), and a bare list of segments
(very old snapshots). A block without ``address`` gets the segment's address plus the
sizes of the blocks before it (blocks tile their segment in order); a block without
``frames`` takes them from its first ``history`` entry (torch 2.0).
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from pathlib import Path
from typing import Any, BinaryIO, Callable, NoReturn

from .. import inputs
from ..errors import BadInput, TooLarge
from .convert import line as _line
from .convert import snapshot_from_data
from .guard import MEMORY_BUDGET, MemoryGuard, OverBudget
from .records import Snapshot
from .scan import scan
from .stream import SnapshotStream

__all__ = [
    "MAX_BYTES",
    "MAX_VALUE",
    "MEMORY_BUDGET",
    "load_snapshot",
    "loads_snapshot",
    "snapshot_from_data",
    "unpickle_plain",
]

_ZIP_MAGIC = b"PK\x03\x04"
#: Largest snapshot read by default, on disk and after gunzip (bytes); torch's own with a
#: million trace entries pickle to a few hundred MiB. ``max_bytes`` (``--max-bytes``) sets it.
MAX_BYTES = 4 * 2**30
#: Longest single value read at once (bytes): a string, a byte string or a pickle frame.
#: A snapshot's are file and function names, and frames of about 64 KiB.
MAX_VALUE = 16 * 2**20


class _RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a global (a class or function): never allowed here."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds only plain data: every global and persistent id is refused."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise _RefusedGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise _RefusedGlobal("a persistent object")


def unpickle_plain(
    data: bytes,
    name: str = "snapshot",
    limit: int | None = None,
    *,
    memory_budget: int | None = MEMORY_BUDGET,
    rss: Callable[[], int] | None = None,
) -> Any:
    """Unpickle ``data`` (gunzipped first, to at most ``limit`` bytes, default
    ``MAX_BYTES``, if it starts with the gzip magic) allowing only plain values; ``name``
    labels the ``BadInput`` raised on any failure. ``memory_budget`` and ``rss``: as for
    ``load_snapshot``."""
    limit = MAX_BYTES if limit is None else limit
    return _unpickle(io.BytesIO(data), name, limit, None, memory_budget, rss)


def _unpickle(
    source: BinaryIO,
    name: str,
    limit: int,
    read_limit: int | None,
    budget: int | None = None,
    rss: Callable[[], int] | None = None,
) -> Any:
    """Unpickle ``source`` (seekable, at its start) allowing only plain values. Past the
    memory ``budget`` (bytes of growth of the resident set ``rss``; None: no bound), stop,
    check the file's shape with ``scan`` (``BadInput`` if it is not a snapshot's) and
    unpickle it again with no bound."""
    if budget is not None:
        try:
            return _unpickle_once(source, name, limit, read_limit, MemoryGuard(budget, rss))
        except OverBudget:
            pass  # what the unpickler built is freed as the exception leaves it
        gc.collect()
        source.seek(0)
        scan(_stream(source, name, limit, read_limit), name, MAX_VALUE)
        source.seek(0)
    return _unpickle_once(source, name, limit, read_limit, None)


def _stream(
    source: BinaryIO, name: str, limit: int, read_limit: int | None, guard: MemoryGuard | None = None
) -> SnapshotStream:
    stream = SnapshotStream(source, name, limit=limit, read_limit=read_limit, max_read=MAX_VALUE, watch=guard)
    first = stream.peek(len(_ZIP_MAGIC))
    if not first:
        raise BadInput(
            f"{name}: empty after gunzip, not a memory snapshot"
            if stream.gzipped
            else f"{name}: empty file, not a memory snapshot"
        )
    if first[: len(_ZIP_MAGIC)] == _ZIP_MAGIC:
        raise BadInput(f"{name}: a zip archive (torch.save output?), not a memory snapshot")
    return stream


def _unpickle_once(
    source: BinaryIO, name: str, limit: int, read_limit: int | None, guard: MemoryGuard | None
) -> Any:
    """Unpickle the stream of ``source`` (see ``SnapshotStream``) allowing only plain
    values, then read the rest of it through; ``guard`` watches memory while unpickling."""
    stream = _stream(source, name, limit, read_limit, guard)
    try:
        value = _PlainUnpickler(stream).load()
    except (BadInput, OverBudget):
        raise  # the stream's own (bounds, cut gzip): already one line naming the file
    except _RefusedGlobal as exc:
        raise BadInput(f"{name}: not a memory snapshot: it asks for {exc}; refused, nothing run") from None
    except EOFError:
        raise BadInput(f"{name}: truncated pickle (ran out of data)") from None
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "truncated" in text:
            raise BadInput(f"{name}: truncated pickle ({text})") from None
        raise BadInput(f"{name}: not a pickle ({text})") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, MemoryError) as exc:
        raise BadInput(f"{name}: not a pickle ({type(exc).__name__}: {_line(exc)})") from None
    stream.watch = None
    stream.drain()
    return value


def load_snapshot(
    path: str | Path,
    max_bytes: int | None = None,
    *,
    memory_budget: int | None = MEMORY_BUDGET,
    rss: Callable[[], int] | None = None,
) -> Snapshot:
    """Read the snapshot at ``path`` (plain or gzip-compressed pickle); ``BadInput``
    (one line) for anything but a regular file holding one, ``errors.TooLarge`` (a
    ``BadInput``) for one over ``max_bytes`` bytes (None: ``MAX_BYTES``, 4 GiB) on disk
    or once gunzipped. Once unpickling has grown the resident set (``rss()``, bytes;
    default ``guard.resident_bytes``) by ``memory_budget`` bytes (default
    ``MEMORY_BUDGET``, 384 MiB), the file's shape is checked in little memory first
    (``scan``) and it is read again only if it is a snapshot's; None: no budget."""
    limit = MAX_BYTES if max_bytes is None else max_bytes
    with inputs.open_regular(path, "a memory snapshot") as handle:
        if os.fstat(handle.fileno()).st_size > limit:
            raise TooLarge(f"{path}: larger than {limit:,} bytes, the most read as a memory snapshot")
        data = _unpickle(handle, str(path), limit, limit, memory_budget, rss)
    return snapshot_from_data(data, str(path))


def loads_snapshot(
    data: bytes,
    source: str = "snapshot",
    max_bytes: int | None = None,
    *,
    memory_budget: int | None = MEMORY_BUDGET,
    rss: Callable[[], int] | None = None,
) -> Snapshot:
    """Read a snapshot from the bytes of its file (gunzipped to at most ``max_bytes``,
    None: ``MAX_BYTES``); ``source`` names it in errors; ``memory_budget`` and ``rss``:
    as for ``load_snapshot``."""
    plain = unpickle_plain(data, source, max_bytes, memory_budget=memory_budget, rss=rss)
    return snapshot_from_data(plain, source)
