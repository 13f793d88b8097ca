"""Durable file primitives: hashing copies, atomic writes, and directory fsyncs."""

import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 8 << 20


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one: temp, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


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
