"""A snapshot file as a bounded stream of bytes, for the unpickler to read as it goes.

The file's bytes (gunzipped when they start with the gzip magic, whatever the file is
called; one member or several, maybe padded with zeros) are made in chunks of
:data:`CHUNK` bytes as the reader asks for them, so the unpacked file is never whole in
memory: a file that is not a pickle is refused within its first chunk, however far it
would expand. Bounded: at most ``read_limit`` bytes are read from the source and at most
``limit`` come out of gunzip (``errors.TooLarge`` past either), and no single read asks
for more than ``max_read`` bytes at once (``errors.BadInput``: a pickle's one string or
frame that long is no memory snapshot's). A cut or corrupt gzip stream raises
``BadInput``. :class:`SnapshotStream` offers what ``pickle.Unpickler`` reads through
(``read``, ``readline``, ``peek``) and counts what it read (``consumed``, ``produced``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import BinaryIO, Callable

from ..errors import BadInput, TooLarge

__all__ = ["CHUNK", "GZIP_MAGIC", "SnapshotStream"]

#: Bytes read from the source, and made by gunzip, at a time. ``pickle.Unpickler`` peeks
#: 128 KiB ahead (``PREFETCH`` in CPython's ``_pickle.c``): two chunks.
CHUNK = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"


class SnapshotStream:
    """The bytes of ``source`` (a binary file, positioned at its start), gunzipped when
    they begin with :data:`GZIP_MAGIC`.

    ``limit``: the most bytes made by gunzip; ``read_limit``: the most read from
    ``source`` (None: no bound, for bytes already in memory); ``max_read``: the most one
    ``read`` or ``readline`` may ask for; ``name``: the file in messages; ``what``: the
    content expected, in the message of a file over ``read_limit``; ``watch``: called
    after each chunk is made (``CHUNK`` bytes, fewer at the end), a memory guard that may
    raise to stop the reader (``guard.MemoryGuard``); None or ``watch = None`` for none.
    ``gzipped`` tells whether it was.
    """

    def __init__(
        self,
        source: BinaryIO,
        name: str,
        *,
        limit: int,
        read_limit: int | None,
        max_read: int,
        what: str = "a memory snapshot",
        watch: Callable[[], None] | None = None,
    ) -> None:
        self._source = source
        self._limit = limit
        self._read_limit = read_limit
        self._max_read = max_read
        self._name = name
        self._what = what
        self.watch = watch
        self.consumed = 0  # bytes read from the source
        self.produced = 0  # bytes made (after gunzip when gzipped)
        first = self._take()
        self.gzipped = first[:2] == GZIP_MAGIC
        self._chunks = self._gunzip(first) if self.gzipped else self._plain(first)
        self._buffer = bytearray()
        self._at = 0  # the read position in the buffer
        self._done = False

    # -- what pickle.Unpickler reads through ----------------------------------------

    def peek(self, n: int = 1) -> bytes:
        """Some of the next bytes (at least ``min(n, what is left)``, up to a chunk
        more), without moving on; ``b""`` at the end."""
        self._fill(max(n, 1))
        return bytes(self._buffer[self._at :])

    def read(self, n: int = -1) -> bytes:
        """The next ``n`` bytes (fewer at the end); ``BadInput`` when ``n`` (or, for
        ``n < 0``, the rest) is over ``max_read``."""
        if n < 0 or n > self._max_read:
            self._too_long(n)
        self._fill(n)
        out = bytes(self._buffer[self._at : self._at + n])
        self._at += len(out)
        return out

    def readline(self, size: int = -1) -> bytes:
        """The next line, its newline included (the rest at the end); ``BadInput`` past
        ``max_read`` bytes without one. ``size`` is not used: the unpickler gives none."""
        searched = 0  # bytes after the read position already searched
        while True:
            end = self._buffer.find(b"\n", self._at + searched)
            if end >= 0:
                return self.read(end + 1 - self._at)
            searched = len(self._buffer) - self._at
            if searched > self._max_read:
                self._too_long(searched)
            if not self._more():
                return self.read(searched)

    def drain(self) -> None:
        """Read to the end, keeping nothing: the bounds and the gzip checks then hold for
        the whole file (trailing data after a pickle included)."""
        self._buffer, self._at = bytearray(), 0
        for _ in self._chunks:
            pass
        self._done = True

    # -- filling ----------------------------------------------------------------------

    def _fill(self, n: int) -> None:
        while len(self._buffer) - self._at < n and self._more():
            pass

    def _more(self) -> bool:
        """Append the next chunk (dropping the bytes already read); False at the end."""
        if self._done:
            return False
        chunk = next(self._chunks, None)
        if chunk is None:
            self._done = True
            return False
        del self._buffer[: self._at]
        self._buffer += chunk
        self._at = 0
        return True

    def _take(self) -> bytes:
        """The next chunk of the source, counted against ``read_limit``."""
        try:
            data = self._source.read(CHUNK)
        except OSError as exc:
            raise BadInput(f"{self._name}: cannot read ({exc.strerror or exc})") from None
        self.consumed += len(data)
        if self._read_limit is not None and self.consumed > self._read_limit:
            raise TooLarge(
                f"{self._name}: larger than {self._read_limit:,} bytes, the most read as {self._what}"
            )
        return data

    def _made(self, data: bytes) -> bytes:
        self.produced += len(data)
        if self.watch is not None:
            self.watch()
        if self.gzipped and self.produced > self._limit:
            raise TooLarge(f"{self._name}: expands past {self._limit:,} bytes when gunzipped: refused")
        return data

    def _plain(self, first: bytes) -> Iterator[bytes]:
        data = first
        while data:
            yield self._made(data)
            data = self._take()

    def _gunzip(self, first: bytes) -> Iterator[bytes]:
        """Each member in turn, ``CHUNK`` bytes of output at a time; zeros between and
        after members are padding."""
        data, inflate = first, None
        while True:
            if not data:
                data = self._take()
                if not data:
                    if inflate is not None and not inflate.eof:
                        raise BadInput(f"{self._name}: truncated or corrupt gzip data (it ends mid-stream)")
                    return
            if inflate is None or inflate.eof:
                data = data.lstrip(b"\0")
                if not data:
                    continue
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out = inflate.decompress(data, CHUNK)
            except zlib.error as exc:
                raise BadInput(f"{self._name}: truncated or corrupt gzip data ({exc})") from None
            data = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
            if out:
                yield self._made(out)

    def _too_long(self, n: int) -> None:
        told = "the rest of the file" if n < 0 else f"{n:,} bytes at once"
        raise BadInput(
            f"{self._name}: not a memory snapshot: it holds a single value of {told} "
            f"(at most {self._max_read:,} read at once)"
        )
