"""Atomic file replacement, the one durable-write primitive both the log's server records and checkpoints use."""

import contextlib
import os
from pathlib import Path

from ftrain.host.private_files import FILE_MODE


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one: temp, fsync, rename. The
    temp file is created with `mode` (default 0600, private whatever the umask) before any byte is in it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a leftover of a crashed writer with our pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)
