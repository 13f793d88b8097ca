"""Durable file primitives for checkpoints: hashing writes and copies, parallel hashing."""

import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 8 << 20


def write_file(path: Path, data: bytes) -> tuple[int, str]:
    """Write and fsync a new file; returns its size and SHA-256."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return len(data), hashlib.sha256(data).hexdigest()


def copy_hashing(src: Path, dst: Path) -> tuple[int, str]:
    """Copy `src` to a new file `dst` in one read pass, hashing as it goes; fsyncs; returns size and SHA-256."""
    digest, size = hashlib.sha256(), 0
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while chunk := fin.read(CHUNK):
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return size, digest.hexdigest()


def hash_file(path: Path) -> tuple[int, str]:
    """Size and SHA-256 of a file (hashlib releases the GIL, so threads hash in parallel)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def hash_files(paths: Iterable[Path], threads: int = 4) -> list[tuple[int, str] | OSError]:
    """Size and SHA-256 of each path, in parallel; an unreadable file yields its OSError."""

    def one(path: Path) -> tuple[int, str] | OSError:
        try:
            return hash_file(path)
        except OSError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, paths))
