"""Proving a run's directory writable at start-up (`workers.storage.probe`): a small private file written,
read back and removed through a descriptor of the directory, and what a file system's refusal means.
"""

import errno
import os
from contextlib import suppress
from pathlib import Path
from typing import Final

from ftrain.host.private_files import private_dir
from ftrain.workers.storage.probe import probe_body, unreadable, unwritable
from ftrain.workers.storage.storage_errors import StorageError, StorageUnavailable

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
        raise probe_verdict(uri, exc) from None
    try:
        _write_read_remove(fd, name, body, uri)
    except OSError as exc:
        raise probe_verdict(uri, exc) from None
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


def probe_verdict(uri: str, exc: OSError) -> StorageError | StorageUnavailable:
    """What a file system's refusal of the probe means: a wrong location, or storage out of reach."""
    why = exc.strerror or str(exc)
    if exc.errno in WRONG_ERRNOS:
        return unwritable(uri, why)
    return StorageUnavailable(f"storage unavailable: {uri}: {why}")
