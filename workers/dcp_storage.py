"""torch.distributed.checkpoint storage with integrity: a writer that hashes every file as DCP writes it, and
a reader that lets DCP parse only bytes that match the manifest.

Hashing after the save would read each shard back (about 10 % of a disk-bound save); hashing in the write
path costs CPU time the disk wait already pays for. DCP writes each file sequentially (one `write` after
another); should a future version seek, the stream notices and the file is hashed from disk instead.
"""

import hashlib
import io
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter

from workers.checkpoint_dir import file_verdict
from workers.files import hash_file
from workers.manifest import FileEntry


class _HashingStream(io.RawIOBase):
    """A write-only view of a file that hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self.raw = raw
        self.sha = hashlib.sha256()
        self.size = 0
        self.sequential = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: "ReadableBuffer") -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.size += len(view)
        return self.raw.write(view)

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.sequential = False
        return self.raw.seek(offset, whence)

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.raw.closed:
            self.raw.flush()
        super().close()


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording each written file's size and SHA-256 (renames follow the file)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[Path, tuple[int, str]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        with path.open(mode) as raw:
            stream = _HashingStream(cast(IO[bytes], raw))
            yield stream
            raw.flush()
        digest = (stream.size, stream.sha.hexdigest()) if stream.sequential else hash_file(path)
        with self._lock:
            self.written[path] = digest

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            if (digest := self.written.pop(Path(path), None)) is not None:
                self.written[Path(new_path)] = digest


class HashingWriter(FileSystemWriter):
    """`FileSystemWriter` whose files come out with their digests: `entries()` after `dcp.save`."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.root = path
        self.fs = HashingFileSystem()

    def entries(self) -> list[FileEntry]:
        """This rank's files (names relative to the checkpoint directory), with sizes and SHA-256."""
        fs = cast(HashingFileSystem, self.fs)
        return sorted(
            (FileEntry(str(p.relative_to(self.root)), size, sha) for p, (size, sha) in fs.written.items()),
            key=lambda e: e.name,
        )


class CorruptFile(OSError):
    """A checkpoint file that is missing or differs from its manifest entry; the message is the reason."""


class _Mapped(io.RawIOBase):
    """A read-only file mapped into memory: hashed in place, then read by DCP with one copy into tensors."""

    def __init__(self, view: memoryview, close: "Callable[[], None]") -> None:
        super().__init__()
        self.view = view
        self.pos = 0
        self._release = close

    @classmethod
    @contextmanager
    def open(cls, path: Path) -> "Iterator[_Mapped | OSError]":
        """The mapped file, or the OSError opening it."""
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as exc:
            yield exc
            return
        view = memoryview(mapping) if mapping is not None else memoryview(b"")

        def release() -> None:
            view.release()
            if mapping is not None:
                mapping.close()

        mapped = cls(view, release)
        try:
            yield mapped
        finally:
            mapped.close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: "WriteableBuffer") -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self.view) - self.pos))
        out[:n] = self.view[self.pos : self.pos + n]
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.view)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        if not self.closed:
            self._release()
        super().close()


class VerifyingFileSystem(FileSystem):
    """DCP's local file system for loading, serving a file only once all of it matched its manifest entry.

    Each file is mapped and hashed whole before DCP parses a byte of it (DCP unpickles non-tensor items with
    `weights_only=False`: a tampered pickle must never reach it); DCP then copies out of the same mapping, so
    the disk is read once.
    """

    def __init__(self, root: Path, entries: dict[str, FileEntry]) -> None:
        super().__init__()
        self.root = root
        self.entries = entries
        self.read: set[str] = set()

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "r" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = str(Path(path).relative_to(self.root))
        entry = self.entries.get(name)
        if entry is None:
            raise CorruptFile(f"file {name} is not in the manifest")
        with _Mapped.open(Path(path)) as mapped:
            found: tuple[int, str] | OSError = (
                mapped
                if isinstance(mapped, OSError)
                else (len(mapped.view), hashlib.sha256(mapped.view).hexdigest())
            )
            if (reason := file_verdict(entry, found)) is not None:
                raise CorruptFile(reason)
            assert isinstance(mapped, _Mapped)
            self.read.add(name)
            yield mapped


class VerifyingReader(FileSystemReader):
    """`FileSystemReader` that loads only verified bytes; `unread()` names the files this rank never needed."""

    def __init__(self, path: Path, entries: tuple[FileEntry, ...]) -> None:
        super().__init__(path)
        self.fs = VerifyingFileSystem(path, {e.name: e for e in entries})

    def unread(self, entries: list[FileEntry]) -> list[FileEntry]:
        """Those of `entries` no `dcp.load` read through this reader (still to be verified on their own)."""
        fs = cast(VerifyingFileSystem, self.fs)
        return [e for e in entries if e.name not in fs.read]
