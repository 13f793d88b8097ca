"""Integrity of checkpoint bytes: the one place their SHA-256 is computed, and the form a digest is written in.

A digest names its algorithm (`sha256:<64 hex>`), so a stored value says how to check it and a second algorithm
could come without a format change. Hashing is streamed, in one pass: bytes are hashed as they are copied or
written, or, for a file being fsync'd, read back from the page cache while the disk syncs (`hash_fd`);
files hashed from disk are hashed in threads (hashlib releases the GIL).
"""

import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Annotated, Final, NewType

import msgspec

from ftrain.workers import progress

ALGORITHM: Final = "sha256"
CHUNK: Final = 8 << 20

Digest = NewType("Digest", str)
"""`sha256:<64 lowercase hex>`; equal digests are equal strings."""

DigestField = Annotated[Digest, msgspec.Meta(pattern=rf"\A{ALGORITHM}:[0-9a-f]{{64}}\Z")]
"""A Digest in a stored struct: checked when it is decoded."""

HexField = Annotated[str, msgspec.Meta(pattern=r"\A[0-9a-f]{64}\Z")]
"""A bare hex SHA-256 in a stored struct (manifest format 1, the log's `checkpoint_hash`)."""


class Hashed(msgspec.Struct, frozen=True):
    """What a file's bytes came to: their count and digest."""

    size: int
    digest: Digest


class Hasher:
    """A running digest over bytes as they pass by (written, copied), so none is read twice."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        """Take the next bytes into the digest."""
        self._sha.update(data)
        self.size += len(data)
        progress.advance(len(data))

    def result(self) -> Hashed:
        """Size and digest of everything so far."""
        return Hashed(self.size, from_hex(self._sha.hexdigest()))


def digest_of(data: bytes) -> Digest:
    """The digest of bytes held in memory."""
    return from_hex(hashlib.sha256(data).hexdigest())


def from_hex(hex_sha256: str) -> Digest:
    """The digest of a bare hex SHA-256 (a format-1 manifest's, the log's)."""
    return Digest(f"{ALGORITHM}:{hex_sha256}")


def to_hex(digest: Digest) -> str:
    """The bare hex of a digest: the form the log's `checkpoint_hash` keeps (stream consumers rely on it)."""
    return digest.removeprefix(f"{ALGORITHM}:")


def hash_stream(stream: IO[bytes]) -> Hashed:
    """Digest a stream to its end in one pass."""
    hasher = Hasher()
    while chunk := stream.read(CHUNK):
        hasher.update(chunk)
    return hasher.result()


def hash_fd(fd: int) -> Hashed:
    """Size and digest of an open file's bytes, read from its start by position (the file's offset is left
    alone, so a writer may still hold it)."""
    hasher = Hasher()
    while chunk := os.pread(fd, CHUNK, hasher.size):
        hasher.update(chunk)
    return hasher.result()


def hash_file(path: Path) -> Hashed:
    """Size and digest of a file on disk. The kernel is asked to read the whole file ahead, so the disk
    reads while the hash runs instead of between its chunks."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        return hash_stream(f)


def hash_files(paths: Iterable[Path], threads: int = 4) -> list[Hashed | OSError]:
    """Size and digest of each path, in parallel; an unreadable file yields its OSError."""

    def one(path: Path) -> Hashed | OSError:
        try:
            return hash_file(path)
        except OSError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, paths))
