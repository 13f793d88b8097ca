"""Proving a run's location writable at start-up: a small private file (object) written, read back and
removed, before the first step, so a location that cannot hold a checkpoint stops the job at once, not after
intervals of compute and failed saves.

What the answer means is kept apart as everywhere else: a location that is wrong (a path nobody can create, a
read-only or another user's directory, the run's directory a link, a bucket that refuses these credentials
a write) is a StorageError, one line, never retried; storage out of reach right now (EIO, ESTALE, a full
disk, a timeout, 5xx, a bucket that does not answer) is StorageUnavailable, and a later start may find it
back. The object store's
probe is `S3RunStore.probe` (boto3 only where S3 is used).
"""

import errno
import os
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Final

from ftrain.events.private import private_dir
from ftrain.workers.layout import probe_name
from ftrain.workers.storage.errors import StorageError, StorageUnavailable

WRONG_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ELOOP})
"""What a file system answers a write for a location that cannot be ours: it will answer the same next time.
(ENOTDIR stays "out of reach", as for every read: it is how some unmounted or stale mounts answer.)"""
_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_CREATE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def probe_dir(run: Path, uri: str) -> None:
    """Create the run's directory if missing, then write, read back and remove a probe file in it, through a
    descriptor of the directory (a link there is refused, never followed)."""
    body, name = probe_body()
    if os.path.islink(run):
        raise StorageError(
            f"checkpoint location {uri} is a symbolic link: name the directory itself "
            "(a run's directory is never reached through a link)"
        )
    try:
        private_dir(run, tighten=False)
        fd = os.open(run, _OPEN_DIR)  # never through a link put there meanwhile
    except OSError as exc:
        raise file_verdict(uri, exc) from None
    try:
        _write_read_remove(fd, name, body, uri)
    except OSError as exc:
        raise file_verdict(uri, exc) from None
    finally:
        os.close(fd)


def _write_read_remove(fd: int, name: str, body: bytes, uri: str) -> None:
    out = os.open(name, _CREATE, 0o600, dir_fd=fd)
    try:
        try:
            os.write(out, body)
            os.fsync(out)
        finally:
            os.close(out)
        back = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        try:
            read = os.read(back, len(body) + 1)
        finally:
            os.close(back)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
    if read != body:
        raise unreadable(uri)


def unwritable(uri: str, why: str) -> StorageError:
    """The one line for a location that cannot hold the run's checkpoints."""
    return StorageError(f"checkpoint location {uri} cannot be written: {why}")


def unreadable(uri: str) -> StorageError:
    """The one line for a location that does not give back what was written to it."""
    return StorageError(f"checkpoint location {uri} does not read back what was written to it")


def file_verdict(uri: str, exc: OSError) -> StorageError | StorageUnavailable:
    """What a file system's refusal of the probe means: a wrong location, or storage out of reach."""
    why = exc.strerror or str(exc)
    if exc.errno in WRONG_ERRNOS:
        return unwritable(uri, why)
    return StorageUnavailable(f"storage unavailable: {uri}: {why}")


def probe_body() -> tuple[bytes, str]:
    """A probe's bytes and name, unique to this start (two starts never take each other's)."""
    nonce = uuid.uuid4().hex
    return nonce.encode(), probe_name(nonce)
