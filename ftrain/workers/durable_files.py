"""Durable file primitives for checkpoints: new files written or copied, fsync'd, and hashed on the way.

Each file is created 0600 (private to its user, whatever the umask) and must not exist yet. A copied file is
hashed while it is being synced (`synced_digest`): the disk wait and the hash overlap instead of adding up.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from ftrain.host.private_files import open_private
from ftrain.workers.integrity import ALGORITHM, CHUNK, Hashed, digest_of, hash_fd


def write_file(path: Path, data: bytes, algorithm: str = ALGORITHM) -> Hashed:
    """Write and fsync a new file; returns its size and digest (by `algorithm`)."""
    with _create(path, os.O_WRONLY) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Hashed(len(data), digest_of(data, algorithm))


def copy_hashing(src: Path, dst: Path, algorithm: str = ALGORITHM) -> Hashed:
    """Copy `src` to a new file `dst` in the kernel (no pass through Python), then fsync `dst` while hashing
    what landed there; returns its size and digest, which a caller compares with what `src` should hold."""
    with open(src, "rb") as fin, _create(dst, os.O_RDWR) as fout:
        offset = 0
        while sent := os.sendfile(fout.fileno(), fin.fileno(), offset, CHUNK):
            offset += sent
        return synced_digest(fout.fileno(), algorithm)


def synced_digest(fd: int, algorithm: str = ALGORITHM, chunk_size: int = 0) -> Hashed:
    """fsync the open file `fd` (readable) while a second thread hashes it back from the page cache: the
    hash costs no wall time where the disk wait leaves a core idle. Its size and digest (and its chunks',
    with a `chunk_size`)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrain-hash") as hasher:
        hashing = hasher.submit(hash_fd, fd, algorithm, chunk_size)
        os.fsync(fd)
        return hashing.result()


def _create(path: Path, access: int) -> BinaryIO:
    return os.fdopen(open_private(path, access | os.O_EXCL), "wb")
