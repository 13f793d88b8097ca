"""The one factory of the storage port: the backend a storage URI (or a run's `Location`) names, by scheme."""

from pathlib import Path
from urllib.parse import urlparse

from ftrain.workers.checkpoint_dir import storage_root
from ftrain.workers.storage.errors import StorageError
from ftrain.workers.storage.file_run import FileRunStore
from ftrain.workers.storage.file_store import FileStorage
from ftrain.workers.storage.location import Location
from ftrain.workers.storage.port import CheckpointStorage, RunStore


def open_storage(text: str) -> CheckpointStorage:
    """A path or `file://` URI: the file system; `s3://bucket[/prefix]`: S3 (or any S3-compatible store,
    reached through the standard AWS chain). Anything else is a StorageError, one line."""
    scheme = urlparse(text).scheme
    if scheme == "s3":
        from ftrain.workers.storage.s3_store import S3Storage, parse_s3_uri

        bucket, prefix = parse_s3_uri(text)
        return S3Storage(bucket, prefix)
    if scheme in ("", "file"):
        return FileStorage(storage_root(text))
    raise StorageError(f"storage {text!r}: scheme {scheme!r} is not supported (use a path, file:// or s3://)")


def open_run(location: Location, stage_dir: Path) -> RunStore:
    """The store of one run's checkpoints, as the trainer's ranks use it; `stage_dir` is this node's private
    work space (async staging; on object storage every upload and download)."""
    if location.backend == "s3":
        from ftrain.workers.storage.s3_run import S3RunStore  # boto3 only where S3 is used

        return S3RunStore(location, stage_dir)
    return FileRunStore(location, stage_dir)


def is_object_storage(text: str) -> bool:
    """The storage URI names an object store."""
    return urlparse(text).scheme == "s3"
