"""The data files of a checkpoint read a chunk at a time, each chunk verified before any of its bytes is used.

A format-3 manifest lists the digest of each fixed-size chunk of a data file. Each chunk is read once (by
position, from a `ChunkSource`: descriptors of local files opened when the load starts, `LocalChunks`, or one
ranged GET a chunk from an object store), hashed, compared with its digest, and only then
are those same bytes handed on: a region is never read again after it was checked, so a disk that changes
under the load cannot slip in unchecked bytes. Background threads check ahead, in the order the load will
ask for the chunks, holding at most the source's `ahead` bytes it was not asked for yet; a read that finds its chunk not
yet taken checks it itself. Chunks are read into buffers reused from chunk to chunk (fresh ones cost a page
fault per 4 KiB): a buffer is reused only once no read wants its chunk and the stream that last handed its
bytes out is closed, which the next read does. After the reads, every chunk of the files this rank answers
for is checked, asked for or not, so a defect is found wherever it lies: the candidate is then refused
(Rejected) as a whole file check would refuse it, and storage out of reach raises StorageUnavailable.
"""

import bisect
import io
import itertools
import os
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

from ftrain.workers.integrity import hex_of
from ftrain.workers.manifest import FileEntry
from ftrain.workers.storage.verdict import absent, unavailable

AHEAD: Final = 32 << 20
"""The most bytes the background check holds for reads still to come, from local files: a few chunks, so few
buffers are needed (256 MiB ahead doubled the page faults and cost 0.15 CPU-s more per 0.5 GB, measured
here)."""
THREADS: Final = 2
"""Threads checking ahead in local files: chunks hash independently, and hashlib and blake3 release the GIL,
so one file's chunks are checked on as many cores (measured: docs/benchmarks.md)."""


class Rejected(Exception):
    """A file a load needs failed verification when it was read or fetched for the load: the checkpoint is
    corrupt (DCP hands it to every rank, so all skip the checkpoint together)."""


class ChunkSource(Protocol):
    """Where the chunks of a load's files are read from, by position: `threads` check ahead, holding at most
    `ahead` bytes for reads still to come. Each method raises Rejected for a file that is not as its entry
    says (missing, another size) and StorageUnavailable when the storage is out of reach."""

    threads: int
    ahead: int

    def open(self, entry: FileEntry, spans: Sequence[tuple[int, int]]) -> None:
        """Make the entry's file ready to read; `spans` (offset, length; (0, 0): all of it) are what the
        load will read of it."""
        ...

    def read(self, entry: FileEntry, offset: int, length: int, buffer: bytearray) -> memoryview:
        """The file's bytes from `offset`, `length` of them unless it ends first: read into `buffer` (whose
        size is the entry's chunk size) or the source's own bytes, never changed after."""
        ...

    def close(self) -> None:
        """Let go what `open` took."""
        ...


class LocalChunks:
    """The files under `root`, each through a descriptor opened when the load starts (a file replaced under
    the load is not read), its chunks read with `preadv` into the buffers handed in."""

    threads = THREADS
    ahead = AHEAD

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, int] = {}

    def open(self, entry: FileEntry, spans: Sequence[tuple[int, int]]) -> None:
        """A descriptor of the entry's file, whose size must be the entry's. The kernel is asked to read ahead
        the spans the load will read (asking for all of a file it reads a little of cost as much system time
        as the reads)."""
        name = entry.name
        path = self.root / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise Rejected(absent(path, self.root, exc, f"file {name} missing")) from exc
        try:
            size = os.fstat(fd).st_size
            for offset, length in spans:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError as exc:
            os.close(fd)
            raise unavailable(path, exc) from exc
        if size != entry.size:
            os.close(fd)
            raise Rejected(f"file {name} is {size} bytes, manifest says {entry.size}")
        self._fds[name] = fd

    def read(self, entry: FileEntry, offset: int, length: int, buffer: bytearray) -> memoryview:
        data = memoryview(buffer)[:length]
        done = 0
        try:
            while done < length and (n := os.preadv(self._fds[entry.name], [data[done:]], offset + done)):
                done += n
        except OSError as exc:
            raise unavailable(self.root / entry.name, exc) from exc
        return data[:done]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


@dataclass(eq=False)
class _Chunk:
    """One chunk of a file: where it lies, how many reads still want its bytes, and what its check found."""

    entry: FileEntry
    index: int
    offset: int
    length: int
    wanted: int = 0
    taken: bool = False
    checked: bool = False
    data: memoryview | None = None
    buffer: bytearray | None = None
    failure: Exception | None = None
    ready: threading.Event = field(default_factory=threading.Event)


class VerifiedChunks:
    """The chunked `entries` of `source`, read through `read` in the order of `reads` (file name, offset,
    length), every chunk of the files named in `complete` checked by `finish`. A context manager: the
    background check runs inside it."""

    def __init__(
        self,
        source: ChunkSource,
        entries: Mapping[str, FileEntry],
        reads: Sequence[tuple[str, int, int]],
        complete: Collection[str],
    ) -> None:
        self._source = source
        self._entries = entries
        self._chunks = {name: _chunks_of(entry) for name, entry in entries.items()}
        self._order: list[_Chunk] = []
        self._complete = frozenset(complete)
        self._files = list(dict.fromkeys([*(name for name, _, _ in reads), *sorted(complete)]))
        for name, offset, length in reads:
            for chunk in self._covering(name, offset, length):
                chunk.wanted += 1
                if chunk.wanted == 1:
                    self._order.append(chunk)
        self._order += [c for name in sorted(complete) for c in self._chunks[name] if not c.wanted]
        self._pool: dict[int, list[bytearray]] = {}
        self._lent: tuple[Segments, list[bytearray]] | None = None
        self._held = 0
        self._next = 0
        self._stop = False
        self._failure: Exception | None = None
        self._lock = threading.Condition()
        self._threads = [
            threading.Thread(target=self._check_ahead, name="ftrain-verify", daemon=True)
            for _ in range(source.threads)
        ]

    def __enter__(self) -> "VerifiedChunks":
        try:
            for name in self._files:
                self._source.open(self._entries[name], self._spans(name))
        except BaseException:
            self.__exit__()
            raise
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_lent()
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()
        self._source.close()
        self._pool.clear()

    def read(self, name: str, offset: int, length: int) -> "Segments":
        """`length` bytes of file `name` from `offset`, as a stream over chunks verified for this read
        (Rejected or StorageUnavailable when one fails): their bytes are not copied again. It closes the
        stream the previous read returned (DCP takes one item's bytes at a time): only then are the buffers
        of the chunks no read wants any more reused, so a stream's bytes never change under it (a closed
        one refuses to read)."""
        self._close_lent()
        chunks = list(self._covering(name, offset, length))
        parts = []
        for chunk in chunks:
            data = self._verified(chunk)
            start = max(offset - chunk.offset, 0)
            parts.append(data[start : min(offset + length - chunk.offset, chunk.length)])
        retired = []
        with self._lock:
            for chunk in chunks:
                chunk.wanted -= 1
                if chunk.wanted <= 0 and chunk.buffer is not None:
                    self._held -= chunk.length
                    retired.append(chunk.buffer)
                    chunk.data = chunk.buffer = None
                    self._lock.notify_all()
        stream = Segments(parts)
        self._lent = (stream, retired)
        return stream

    def finish(self) -> None:
        """Wait until every chunk the background check took on is checked; raise what failed first."""
        for thread in self._threads:
            thread.join()
        if self._failure is not None:
            raise self._failure

    def _covering(self, name: str, offset: int, length: int) -> Iterator[_Chunk]:
        chunks = self._chunks[name]
        if not chunks:
            return
        size = chunks[0].entry.chunk_size
        last = min((offset + max(length, 1) - 1) // size, len(chunks) - 1)
        yield from chunks[offset // size : last + 1]

    def _close_lent(self) -> None:
        """Close the stream the last read returned; the buffers it retired are free for other chunks."""
        if self._lent is not None:
            (stream, retired), self._lent = self._lent, None
            stream.close()
            with self._lock:
                for buffer in retired:
                    self._pool.setdefault(len(buffer), []).append(buffer)

    def _verified(self, chunk: _Chunk) -> memoryview:
        """The chunk's bytes, checked here when nobody has taken it yet (or its checked bytes were let go:
        they are read and checked again), else once its checker is done."""
        with self._lock:
            mine = not chunk.taken or (chunk.checked and chunk.data is None)
            if mine:
                chunk.taken, chunk.checked = True, False
                chunk.ready.clear()
        if mine:
            self._check(chunk, keep=True)
        else:
            chunk.ready.wait()
        if chunk.failure is not None:
            raise chunk.failure
        assert chunk.data is not None
        return chunk.data

    def _check_ahead(self) -> None:
        while chunk := self._next_ahead():
            if not self._check(chunk, keep=chunk.wanted > 0):
                return

    def _next_ahead(self) -> _Chunk | None:
        """The next chunk in read order nobody has taken, once holding it keeps within the source's `ahead` (None: all
        are taken, one failed, or the reads are over)."""
        with self._lock:
            while not self._stop and self._failure is None and self._next < len(self._order):
                chunk = self._order[self._next]
                if chunk.taken:
                    self._next += 1
                elif chunk.wanted and self._held and self._held + chunk.length > self._source.ahead:
                    self._lock.wait()
                else:
                    chunk.taken = True
                    self._next += 1
                    return chunk
            return None

    def _check(self, chunk: _Chunk, keep: bool) -> bool:
        """Read the chunk once, into a free buffer, and hash it: whether it matches (its bytes kept for later
        reads if `keep` and a read still wants them; else what failed recorded)."""
        size = chunk.entry.chunk_size
        with self._lock:
            free = self._pool.get(size)
            buffer = free.pop() if free else None
        if buffer is None:  # reused ones cost no page faults (fresh ones cost 0.1 CPU-s per GB, measured)
            buffer = bytearray(size)
        data: memoryview | None = None
        try:
            data = _read_chunk(self._source, chunk, buffer)
        except Exception as exc:  # Rejected, StorageUnavailable; anything else is raised where it is read
            chunk.failure = exc
        with self._lock:
            if chunk.failure is not None:
                self._failure = self._failure or chunk.failure
            else:
                chunk.checked = True
            if data is not None and keep and chunk.wanted > 0:
                chunk.data, chunk.buffer = data, buffer
                self._held += chunk.length
            else:
                self._pool.setdefault(size, []).append(buffer)
        chunk.ready.set()
        return data is not None

    def _spans(self, name: str) -> list[tuple[int, int]]:
        """What the load reads of file `name`: all of a file this rank answers for, of another only the
        chunks its reads want."""
        if name in self._complete:
            return [(0, 0)]
        return [(c.offset, c.length) for c in self._chunks[name] if c.wanted]


class Segments(io.RawIOBase):
    """A seekable read-only stream over byte segments held in memory (bytes never changed while it is open):
    read into the caller's buffer straight from them. No view of them leaves it, so once it is closed (it
    then refuses to read) nothing can see their buffers reused."""

    def __init__(self, parts: Sequence[memoryview]) -> None:
        super().__init__()
        self._parts = parts
        self._starts = list(itertools.accumulate((len(p) for p in parts), initial=0))
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        for part in self._parts:
            part.release()
        super().close()

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
        self._pos = max(base + offset, 0)
        return self._pos

    def readall(self) -> bytes:
        rest = self._starts[-1] - self._pos
        data = bytearray(max(rest, 0))
        self.readinto(data)
        return bytes(data)

    def readinto(self, buffer: "WriteableBuffer") -> int:
        if self.closed:
            raise ValueError("read of a closed stream of verified chunks")
        out = memoryview(buffer).cast("B")
        done = 0
        i = max(bisect.bisect_right(self._starts, self._pos) - 1, 0)
        while done < len(out) and i < len(self._parts):
            part = self._parts[i][self._pos - self._starts[i] :]
            n = min(len(part), len(out) - done)
            out[done : done + n] = part[:n]
            done += n
            self._pos += n
            i += 1
        return done


def _chunks_of(entry: FileEntry) -> list[_Chunk]:
    size = entry.chunk_size
    return [
        _Chunk(entry, i, offset, min(size, entry.size - offset))
        for i, offset in enumerate(range(0, entry.size, size))
    ]


def _read_chunk(source: ChunkSource, chunk: _Chunk, buffer: bytearray) -> memoryview:
    """The chunk's bytes, read once (into `buffer`, where the source reads into it), when they match its
    digest; else Rejected (StorageUnavailable: the read failed)."""
    entry = chunk.entry
    data = source.read(entry, chunk.offset, chunk.length, buffer)
    if len(data) != chunk.length:
        raise Rejected(f"file {entry.name} ended at chunk {chunk.index + 1} of {len(entry.chunks)}")
    if hex_of(data, entry.algorithm) != entry.chunks[chunk.index]:
        raise Rejected(f"file {entry.name} hash mismatch")  # as a whole-file check says it
    return data
