"""The checkpoint manifest and completion marker: the formats that make a checkpoint verifiable.

The checkpoint's integrity hash is SHA-256 over the manifest's stored bytes. It goes into the `checkpointed`
event, so a tampered manifest is caught against the log and a tampered file against the manifest.
"""

import hashlib
from datetime import datetime
from typing import Any

import msgspec

MANIFEST = "manifest.json"
MARKER = ".complete"
FORMAT = 1


class FileEntry(msgspec.Struct, frozen=True):
    """One data file of a checkpoint."""

    name: str
    size: int
    sha256: str


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


class Marker(msgspec.Struct, frozen=True):
    """The completion marker, written last: a checkpoint without it never completed."""

    manifest_sha256: str
    step: int


def encode_manifest(manifest: Manifest) -> bytes:
    """Canonical manifest bytes (files in name order)."""
    files = tuple(sorted(manifest.files, key=lambda f: f.name))
    return msgspec.json.encode(msgspec.structs.replace(manifest, files=files))


def digest(data: bytes) -> str:
    """Hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


decode_manifest = msgspec.json.Decoder(Manifest).decode
decode_marker = msgspec.json.Decoder(Marker).decode
