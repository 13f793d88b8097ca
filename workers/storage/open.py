"""The one factory of the storage port: the backend a storage URI names, by scheme."""

from urllib.parse import urlparse

from ftrain.workers.checkpoint_dir import storage_root
from ftrain.workers.storage.errors import StorageError
from ftrain.workers.storage.file_store import FileStorage
from ftrain.workers.storage.port import CheckpointStorage


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


def is_object_storage(text: str) -> bool:
    """The storage URI names an object store."""
    return urlparse(text).scheme == "s3"
