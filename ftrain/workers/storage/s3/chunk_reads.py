"""The chunks of a step's objects read straight from the store for a load: one ranged GET a chunk.

A format-3 manifest lists each data file's chunk digests; a resume from S3 hands DCP each chunk's bytes once
they match (`workers.verified_chunks`), without downloading the file first. Each read asks for exactly one
chunk's span, several in flight, each answer checked against the manifest's size as a whole download's
ranges are (`ranged.get_range`): a missing object or one of another size is Rejected, anything out of reach
StorageUnavailable, never a verdict of corruption. No byte is written to a disk.
"""

from collections.abc import Sequence
from typing import Any, Final

from ftrain.workers.integrity import DIGEST_CHUNK
from ftrain.workers.manifest import FileEntry
from ftrain.workers.storage.s3 import ranged
from ftrain.workers.verified_chunks import Rejected

THREADS: Final = ranged.THREADS
"""Chunks fetched and checked at once (each thread GETs a chunk, then hashes it)."""
AHEAD: Final = THREADS * DIGEST_CHUNK
"""The most bytes held for reads still to come: one chunk per thread."""


class RangedChunks:
    """The objects under `key_prefix` of `bucket`, read a chunk at a time by ranged GETs through `client`."""

    threads = THREADS
    ahead = AHEAD

    def __init__(self, client: Any, bucket: str, key_prefix: str) -> None:
        self.client, self.bucket, self.key_prefix = client, bucket, key_prefix

    def open(self, entry: FileEntry, spans: Sequence[tuple[int, int]]) -> None:
        """Nothing to open: each ranged answer names the object's size, checked as it arrives."""
        if "/" in entry.name or entry.name in ("", ".", ".."):
            raise Rejected(f"file name {entry.name!r} is not allowed")

    def read(self, entry: FileEntry, offset: int, length: int, buffer: bytearray) -> memoryview:
        """The answer's own bytes (`buffer` goes unused: the client hands over bytes it allocated)."""
        try:
            return memoryview(
                ranged.get_range(
                    self.client, self.bucket, self.key_prefix + entry.name, entry, offset, length
                )
            )
        except ranged.Defect as exc:
            raise Rejected(str(exc)) from exc

    def close(self) -> None:
        """Nothing held: each GET's connection went back to the client's pool."""
