"""The storage port: what the CLI and resume do with checkpoints, addressed by URI, whatever holds them.

A storage root is a URI (`file:///lustre/ckpt`, `s3://bucket/prefix`); a run's checkpoints live under
`<root>/<run_id>/step-<N>`. Every backend gives the same guarantees: a step is absent or complete (data files,
then the manifest, then the completion marker, sealed last and never overwritten); a checkpoint URI is trusted
only when it names a step directly under the run's own location (`confined`); verification reads each byte
once, hashing it, and never parses a byte before its hash matched; "storage unavailable" (raised as
`StorageUnavailable`) is never reported as corruption. Backends are chosen by scheme in `workers.storage.open`.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ftrain.projections.lifecycle import OnDisk
from ftrain.workers.layout import SetAsideKind
from ftrain.workers.manifest import Manifest


class StoredCheckpoint(msgspec.Struct, frozen=True):
    """A sealed checkpoint: its URI and the hash that identifies its manifest in the log."""

    uri: str
    manifest: Manifest
    checkpoint_hash: str


Source = tuple[str, bytes | Path]
"""A data file of a checkpoint: its name, and its bytes or a local file to upload or copy."""


class CheckpointStorage(Protocol):
    """One storage root."""

    @property
    def root(self) -> str:
        """The root's canonical URI (what a `launched` event records)."""
        ...

    def write(
        self,
        *,
        run_id: str,
        step: int,
        epoch: int,
        shards: int,
        sources: Sequence[Source],
        world_size: int = 1,
        dataset_revision: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> StoredCheckpoint:
        """Write the data files, the manifest, and last the marker. CheckpointExists when the step is taken
        (another writer sealed it, or an interrupted write is in the way); nothing is left behind on failure."""
        ...

    def complete(self, run_id: str) -> list[OnDisk]:
        """The run's marked steps, newest first, each with the hash its marker claims (unverified)."""
        ...

    def confined(self, uri: str, run_id: str) -> str | None:
        """`uri` when it names a step location directly under the run's own, else None (refused unread)."""
        ...

    def verify(
        self, uri: str, expected_hash: str, *, run_id: str | None = None, step: int | None = None
    ) -> str | None:
        """None when the checkpoint at `uri` is valid for the log's hash, else why not."""
        ...

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        """Move the checkpoint out of its step's name, kept as evidence; its new URI, None if it was gone."""
        ...

    def delete(self, uri: str) -> None:
        """Delete a checkpoint this process wrote and could not record."""
        ...

    def clean(self, run_id: str) -> list[str]:
        """Remove stale partial work of the run that no live writer owns; what was removed."""
        ...
