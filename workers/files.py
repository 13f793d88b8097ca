"""Durable file primitives for checkpoints: new files written or copied, fsync'd, and hashed on the way.

Each file is created 0600 (private to its user, whatever the umask) and must not exist yet.
"""

import os
from pathlib import Path
from typing import BinaryIO

from events.private import open_private
from workers.integrity import Hashed, digest_of, hash_stream


def write_file(path: Path, data: bytes) -> Hashed:
    """Write and fsync a new file; returns its size and digest."""
    with _create(path) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Hashed(len(data), digest_of(data))


def copy_hashing(src: Path, dst: Path) -> Hashed:
    """Copy `src` to a new file `dst` in one read pass, hashing as it goes; fsyncs; returns size and digest."""
    with open(src, "rb") as fin, _create(dst) as fout:
        hashed = hash_stream(fin, fout)
        fout.flush()
        os.fsync(fout.fileno())
    return hashed


def _create(path: Path) -> BinaryIO:
    return os.fdopen(open_private(path, os.O_WRONLY | os.O_EXCL), "wb")
