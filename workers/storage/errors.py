"""What any storage backend raises: a location ftrain cannot use, storage out of reach, a step already there."""


class StorageError(ValueError):
    """A storage location ftrain cannot use."""


class StorageUnavailable(Exception):
    """The storage cannot be read right now (unmounted, EIO, EACCES, ESTALE, a timeout; on S3 an unreachable
    endpoint, 5xx, AccessDenied, bad credentials, NoSuchBucket): nothing is known about the checkpoints, so
    nothing may be recorded against them or moved. Only bytes that are present and wrong, or files missing from
    a checkpoint whose location can be listed, make a checkpoint corrupt."""


class CheckpointExists(FileExistsError):
    """The step is already there (another writer, or an interrupted earlier attempt)."""
