"""DCP's file system over a step's key prefix: each file DCP writes goes up as it is written, from memory, hashed
on the way (no local file, every byte handled once), as `s3torchconnector`'s `S3StorageWriter` does.

`streamed_writer` gives a `HashingWriter` (the trainer's, with its `entries()`) whose files are objects under
the claimed step's prefix: each a `PartUpload` (multipart when larger than one part), its digest taken from
the bytes as they pass to the part buffer. A file appears only whole (its upload completed), so the step holds
no torn object; a failure aborts the file's upload and raises StorageUnavailable, which DCP hands to every
rank, and the save is discarded as any failed save is. Nothing here seals: the manifest, the marker and the
fence stay `step_objects.seal`'s, after every rank's files are in.

DCP writes each file front to back and asks where it is (`tell`) between items; a seek is refused
(`io.UnsupportedOperation`): an upload in flight cannot go back. Its `.metadata` is written under a temporary
name, then renamed: S3 has no rename, so that small object is copied server-side and the temporary deleted.
"""

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePath, PurePosixPath
from typing import TYPE_CHECKING

from torch.distributed.checkpoint.filesystem import FileSystemBase

from ftrain.workers.dcp_writer import HashingWriter
from ftrain.workers.integrity import DIGEST_CHUNK, Hashed, Hasher
from ftrain.workers.storage.s3.bucket import Bucket
from ftrain.workers.storage.s3.part_upload import PartUpload

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class _PartStream(io.RawIOBase):
    """A write-only, forward-only view of one `PartUpload`, hashing what passes through it."""

    def __init__(self, upload: PartUpload, hasher: Hasher) -> None:
        super().__init__()
        self.upload, self.hasher = upload, hasher

    def writable(self) -> bool:
        return True

    def write(self, data: "ReadableBuffer") -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self.upload.write(view)
        return len(view)

    def tell(self) -> int:
        return self.upload.size


class StreamingFileSystem(FileSystemBase):
    """The step's objects as DCP's file system, recording each written object's size and digest by
    `algorithm` (a rename follows the object)."""

    def __init__(self, bucket: Bucket, algorithm: str) -> None:
        super().__init__()
        self.bucket, self.algorithm = bucket, algorithm
        self.written: dict[PurePath, Hashed] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            raise io.UnsupportedOperation(f"{path}: a streamed checkpoint is written, never read back")
        upload = PartUpload(self.bucket, str(path))
        stream = _PartStream(upload, Hasher(self.algorithm, DIGEST_CHUNK))
        try:
            yield stream
            upload.finish()
        except BaseException:
            upload.abort()
            raise
        with self._lock:
            self.written[PurePosixPath(path)] = stream.hasher.result()

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{path}/{suffix}"

    def init_path(self, path: str | os.PathLike[str]) -> str:
        """The key prefix, a plain string: DCP pickles it into `.metadata` (as the checkpoint id), and a
        resume unpickles only allowlisted types."""
        return str(PurePosixPath(path))

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self.bucket.copy(str(path), str(new_path))
        self.bucket.delete([str(path)])
        with self._lock:
            if (hashed := self.written.pop(PurePosixPath(path), None)) is not None:
                self.written[PurePosixPath(new_path)] = hashed

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        """A key prefix needs no making."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Never picked by DCP from a checkpoint id: the trainer hands it over itself."""
        return False

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.bucket.exists(str(path))

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.bucket.delete([str(path)])


def streamed_writer(bucket: Bucket, step_key: str, algorithm: str) -> HashingWriter:
    """The DCP writer of one rank's files into the claimed step at `step_key` (ending in '/'), each streamed
    as it is written and hashed by `algorithm`; `entries()` after `dcp.save`."""
    return HashingWriter(PurePosixPath(step_key), fs=StreamingFileSystem(bucket, algorithm))
