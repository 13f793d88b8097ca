"""The checkpoint manifest and completion marker: the formats that make a checkpoint verifiable.

The checkpoint's integrity hash is the digest of the manifest's stored bytes. It goes into the `checkpointed`
event, so a tampered manifest is caught against the log and a tampered file against the manifest.

Format 2 writes digests that name their algorithm (`digest`, `manifest_digest`); format 1 wrote bare hex
SHA-256 (`sha256`, `manifest_sha256`). Both read: checkpoints already on disk stay resumable. A data file's
digest is SHA-256 or BLAKE3, as its writer was configured (`workers.integrity`), recorded per file by the
name its digest carries, so format 2 holds either without a new field or a format of its own (a manifest of
before BLAKE3 reads as it always did: every digest names sha256). The manifest's own digest, in the marker
and the log, is always SHA-256.

Format 3 adds, per data file, the digest of each fixed-size chunk (`chunk_size`, `chunks`, by the entry's
algorithm) beside the whole file's digest, which stays what it was: the root every whole-file check (the CLI's
verify, a download, a format 2 reader) compares. A resume checks a file chunk by chunk instead, so DCP parses
a chunk's items as soon as that chunk is verified. Entries without chunks (formats 1 and 2, files put whole)
read as before.
"""

from datetime import datetime
from typing import Any

import msgspec

from ftrain.workers.integrity import DigestField, Hashed, HexField, Sha256Field, algorithm_of, from_hex

FORMAT = 3


class FileEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One data file of a checkpoint: its size and digest, and (format 3) its chunks' digests."""

    name: str
    size: int
    digest: DigestField
    chunk_size: int = 0
    """The span of each chunk digest (the last chunk may be shorter); 0: the file has none."""
    chunks: tuple[HexField, ...] = ()
    """The hex digest of each chunk in turn, by the algorithm `digest` names."""

    @property
    def algorithm(self) -> str:
        """The algorithm its digest names: the one its bytes are checked with."""
        return algorithm_of(self.digest)

    @property
    def chunked(self) -> bool:
        """Whether its chunks' digests are listed: a reader may check it a chunk at a time."""
        return self.chunk_size > 0


def entry_of(name: str, hashed: Hashed) -> FileEntry:
    """The manifest entry of a data file named `name` whose bytes came to `hashed`."""
    return FileEntry(name, hashed.size, hashed.digest, hashed.chunk_size, hashed.chunks)


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything needed to check a checkpoint and to resume from it exactly."""

    format: int = FORMAT
    run_id: str
    step: int
    epoch: int
    shards: int
    world_size: int
    dataset_revision: str | None
    created_at: datetime
    files: tuple[FileEntry, ...]
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        """Total bytes of the data files."""
        return sum(f.size for f in self.files)


class Marker(msgspec.Struct, frozen=True, omit_defaults=True):
    """The completion marker, written last: a checkpoint without it never completed."""

    manifest_digest: Sha256Field
    step: int
    attempt: int = 0
    """The attempt that sealed it (0, and left out: sealed by no attempt, or before attempts existed)."""


class _Format(msgspec.Struct):
    format: int


class _FileV1(msgspec.Struct, frozen=True):
    name: str
    size: int
    sha256: HexField


class _MarkerV1(msgspec.Struct, frozen=True):
    manifest_sha256: HexField
    step: int


def encode_manifest(manifest: Manifest) -> bytes:
    """Canonical manifest bytes (files in name order)."""
    files = tuple(sorted(manifest.files, key=lambda f: f.name))
    return msgspec.json.encode(msgspec.structs.replace(manifest, files=files))


def decode_manifest(raw: bytes) -> Manifest:
    """A manifest of either format, its file entries in format 2's form."""
    if _decode_format(raw).format != 1:
        return _decode_manifest(raw)
    fields = msgspec.json.decode(raw, type=dict[str, Any])
    old = msgspec.convert(fields.get("files"), tuple[_FileV1, ...])
    fields["files"] = [FileEntry(f.name, f.size, from_hex(f.sha256)) for f in old]
    return msgspec.convert(fields, Manifest)


def decode_marker(raw: bytes) -> Marker:
    """A marker of either format (format 1 had no format field: its digest field tells)."""
    try:
        return _decode_marker(raw)
    except msgspec.ValidationError:
        old = _decode_marker_v1(raw)
        return Marker(from_hex(old.manifest_sha256), old.step)


_decode_format = msgspec.json.Decoder(_Format).decode
_decode_manifest = msgspec.json.Decoder(Manifest).decode
_decode_marker = msgspec.json.Decoder(Marker).decode
_decode_marker_v1 = msgspec.json.Decoder(_MarkerV1).decode
