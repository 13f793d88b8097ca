"""Durable file primitives for checkpoints: new files written or copied, fsync'd, and hashed on the way."""

import os
from pathlib import Path

from workers.integrity import Hashed, digest_of, hash_stream


def write_file(path: Path, data: bytes) -> Hashed:
    """Write and fsync a new file; returns its size and digest."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Hashed(len(data), digest_of(data))


def copy_hashing(src: Path, dst: Path) -> Hashed:
    """Copy `src` to a new file `dst` in one read pass, hashing as it goes; fsyncs; returns size and digest."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        hashed = hash_stream(fin, fout)
        fout.flush()
        os.fsync(fout.fileno())
    return hashed
