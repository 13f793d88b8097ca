"""What any storage backend raises: a location ftrain cannot use, storage out of reach, a step already there,
a newer attempt (and the one test for it); and the one verdict every backend gives a URI outside the run."""

from typing import Final

from ftrain.events.base_error import FtrainError

OUTSIDE_RUN: Final = "outside the run's storage root"
"""Why a checkpoint URI is refused unread: it does not name a step of the run's own."""


class StorageError(ValueError):
    """A storage location ftrain cannot use."""


class StorageUnavailable(FtrainError):
    """The storage cannot be read right now (unmounted, EIO, EACCES, ESTALE, a timeout; on S3 an unreachable
    endpoint, 5xx, AccessDenied, bad credentials, NoSuchBucket): nothing is known about the checkpoints, so
    nothing may be recorded against them or moved. Only bytes that are present and wrong, or files missing from
    a checkpoint whose location can be listed, make a checkpoint corrupt."""


class MissingCredentials(StorageUnavailable):
    """The storage found no credentials, or refused the ones it was given (an unknown key, a bad signature):
    it will answer the same until the credentials are fixed."""


class CheckpointExists(FileExistsError):
    """The step is already there (another writer, or an interrupted earlier attempt)."""


class Fenced(FtrainError, RuntimeError):
    """A newer attempt owns the run's checkpoints: this one must write nothing more."""


def refuse(attempt: int, held: int, run: str) -> None:
    """Raise Fenced when `held`, the attempt that last claimed the run, is newer than `attempt` (any backend)."""
    if held > attempt:
        raise Fenced(f"attempt {attempt} is superseded by attempt {held} of {run}; writing nothing")
