"""A run's checkpoint location, parsed once: which backend holds it, its root, and the run's name.

`FTRAIN_STORAGE`, a launch's `--storage`, a script's argument and a `launched` event's root all name a storage
root (`/lustre/ckpt`, `file:///lustre/ckpt`, `s3://bucket/prefix`); a run's checkpoints live at
`<root>/<run>`. Everything else takes a `Location` and never parses a location string again.
"""

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import msgspec

from ftrain.workers.checkpoint_dir import path_uri, storage_root
from ftrain.workers.storage.errors import StorageError

Backend = Literal["file", "s3"]


class Location(msgspec.Struct, frozen=True):
    """One run's checkpoints: the storage root's canonical URI and the run's name under it."""

    backend: Backend
    root: str
    """`file:///abs/path` or `s3://bucket[/prefix]`, without a trailing slash."""
    run: str

    @property
    def uri(self) -> str:
        """The run's own location: `<root>/<run>`."""
        return f"{self.root}/{self.run}"

    @property
    def path(self) -> Path:
        """The run's directory (file system only)."""
        if self.backend != "file":
            raise StorageError(f"{self.uri} is on object storage, not a file system")
        return storage_root(self.root) / self.run

    @property
    def bucket_prefix(self) -> tuple[str, str]:
        """(bucket, prefix) of the root (object storage only)."""
        parsed = urlparse(self.root)
        if self.backend != "s3":
            raise StorageError(f"{self.uri} is on a file system, not object storage")
        return parsed.netloc, parsed.path.strip("/")


def parse_root(text: str | Path) -> tuple[Backend, str]:
    """The backend and canonical URI of a storage root written as a path, `file://` or `s3://` URI;
    StorageError (one line) for anything else, an empty string included."""
    if isinstance(text, Path):
        return "file", path_uri(storage_root(str(text)))
    if not text.strip():  # never the current directory by accident
        raise StorageError(f"storage {text!r}: empty (use a path, file:// or s3://)")
    scheme = urlparse(text).scheme
    if scheme == "s3":
        from ftrain.workers.storage.s3_store import parse_s3_uri

        bucket, prefix = parse_s3_uri(text)
        return "s3", f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if scheme in ("", "file"):
        return "file", path_uri(storage_root(text))
    raise StorageError(f"storage {text!r}: scheme {scheme!r} is not supported (use a path, file:// or s3://)")


def run_location(text: str | Path) -> Location:
    """The location of a run written whole (`/ckpt/my-run`, `s3://bucket/prefix/my-run`): its last
    segment is the run's name."""
    backend, uri = parse_root(text)
    root, _, run = uri.rpartition("/")
    if not run or root in ("file://", "s3:/"):  # the file system's root, or a bare bucket
        raise StorageError(f"checkpoint location {str(text)!r}: name the run's own directory or prefix")
    return Location(backend, root, run)


def under_root(root: str | Path, run: str) -> Location:
    """The location of run `run` under the storage root `root` (how `ftrain run` places a run)."""
    backend, uri = parse_root(root)
    return Location(backend, uri.rstrip("/"), run)
