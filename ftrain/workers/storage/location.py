"""A run's checkpoint location, parsed once: which backend holds it, its root, and the run's name.

`FTRAIN_STORAGE`, a launch's `--storage`, a script's argument and a `launched` event's root all name a storage
root (`/lustre/ckpt`, `file:///lustre/ckpt`, `s3://bucket/prefix`); a run's checkpoints live at
`<root>/<run>`. Everything else takes a `Location` and never parses a location string again.
"""

from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

import msgspec

from ftrain.workers.storage.storage_errors import StorageError

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

    def same(self, other: "Location") -> bool:
        """Whether both name one run's checkpoints (on a file system, whatever links lead there)."""
        if self.backend != other.backend:
            return False
        return (
            self.path.resolve() == other.path.resolve() if self.backend == "file" else self.uri == other.uri
        )


def parse_root(text: str | Path) -> tuple[Backend, str]:
    """The backend and canonical URI of a storage root written as a path, `file://` or `s3://` URI;
    StorageError (one line) for anything else, an empty string included."""
    if isinstance(text, Path):
        return "file", path_uri(storage_root(str(text)))
    if not text.strip():  # never the current directory by accident
        raise StorageError(f"storage {text!r}: empty (use a path, file:// or s3://)")
    scheme = urlparse(text).scheme
    if scheme == "s3":
        bucket, prefix = parse_s3_uri(text)
        return "s3", f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if scheme in ("", "file"):
        return "file", path_uri(storage_root(text))
    raise StorageError(f"storage {text!r}: scheme {scheme!r} is not supported (use a path, file:// or s3://)")


def storage_root(text: str) -> Path:
    """The directory behind a storage location: a path or a `file://` URI."""
    parsed = urlparse(text)
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):  # never drop a host silently
        raise StorageError(
            f"storage {text!r}: file:// on host {parsed.netloc!r} is not supported (use file:///path)"
        )
    if parsed.scheme in ("", "file"):
        try:  # a path the log cannot record as text, or whose escapes would decode to another path, is none
            name = unquote(parsed.path, errors="strict") if parsed.scheme else text
            name.encode()
        except UnicodeError:
            raise StorageError(f"storage {text!r}: not UTF-8 once its %-escapes are decoded") from None
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        return path
    raise StorageError(f"storage {text!r}: scheme {parsed.scheme!r} is not supported (use a path or file://)")


def path_uri(path: Path) -> str:
    """The `file://` URI of a path."""
    return path.absolute().as_uri()


def uri_path(uri: str) -> Path:
    """The path behind a `file://` URI."""
    return storage_root(uri)


def parse_s3_uri(text: str) -> tuple[str, str]:
    """(bucket, prefix without surrounding slashes) of `s3://bucket[/prefix]`."""
    parsed = urlparse(text)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if parsed.scheme != "s3" or len(bucket) < 3 or parsed.query or parsed.fragment:
        raise StorageError(
            f"storage {text!r}: expected s3://bucket[/prefix] (a bucket name has 3+ characters)"
        )
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise StorageError(f"storage {text!r}: the prefix has an empty, '.' or '..' segment")
    return bucket, prefix


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
