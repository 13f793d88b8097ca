"""A torch.distributed.checkpoint writer that hashes every file as DCP writes it.

Hashing after the save would read each shard back (about 10 % of a disk-bound save); hashing in the write
path costs CPU time the disk wait already pays for. DCP writes each file sequentially (one `write` after
another); should a future version seek, the stream notices and the file is hashed from disk instead.
"""

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from events.private import open_private, private_dir
from workers.integrity import Hashed, Hasher, hash_file
from workers.manifest import FileEntry


class _HashingStream(io.RawIOBase):
    """A write-only view of a file that hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self.raw = raw
        self.hasher = Hasher()
        self.sequential = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: "ReadableBuffer") -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
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
    """DCP's local file system, recording each written file's size and digest (renames follow the file)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[Path, Hashed] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), mode) as raw:
            stream = _HashingStream(cast(IO[bytes], raw))
            yield stream
            raw.flush()
        hashed = stream.hasher.result() if stream.sequential else hash_file(path)
        with self._lock:
            self.written[path] = hashed

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        """Directories DCP makes are private (0700), as every directory ftrain makes is."""
        private_dir(Path(path), tighten=False)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            if (hashed := self.written.pop(Path(path), None)) is not None:
                self.written[Path(new_path)] = hashed


class HashingWriter(FileSystemWriter):
    """`FileSystemWriter` whose files come out with their digests: `entries()` after `dcp.save`."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.root = path
        self.fs = HashingFileSystem()

    def entries(self) -> list[FileEntry]:
        """This rank's files (names relative to the checkpoint directory), with sizes and digests."""
        fs = cast(HashingFileSystem, self.fs)
        return sorted(
            (FileEntry(str(p.relative_to(self.root)), h.size, h.digest) for p, h in fs.written.items()),
            key=lambda e: e.name,
        )
