"""The storage port: what the CLI and resume do with checkpoints, addressed by URI, whatever holds them.

A storage root is a URI (`file:///lustre/ckpt`, `s3://bucket/prefix`); a run's checkpoints live under
`<root>/<run_id>/step-<N>`. Every backend gives the same guarantees: a step is absent or complete (data files,
then the manifest, then the completion marker, sealed last and never overwritten); a checkpoint URI is trusted
only when it names a step directly under the run's own location (`confined`); verification reads each byte
once, hashing it, and never parses a byte before its hash matched; "storage unavailable" (raised as
`StorageUnavailable`) is never reported as corruption. Backends are chosen by scheme in `workers.storage.open`.

`CheckpointStorage` is one storage root as the CLI sees it (whole checkpoints, any run); `RunStore` is one run's
location as the trainer's ranks see it: a step written in parts by many processes (begun by rank 0, each rank's
files moved in, sealed by rank 0), the attempt fence, retention, and each rank's owned files of a candidate made
readable locally, verified, for a resume.
"""

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ftrain.domain.lifecycle import OnDisk
from ftrain.workers.layout import SetAsideKind
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.errors import StorageUnavailable
from ftrain.workers.storage.location import Location


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


class RankFiles(msgspec.Struct, frozen=True):
    """Where one rank writes its files of a step being saved: `final` when that is the step's assembly
    itself (each file made durable as it is written), else a private node-local directory they are moved
    from (`RunStore.deliver`)."""

    path: Path
    final: bool


@dataclass(frozen=True)
class Readable:
    """A rank's owned files of a candidate, local and judged: the directory DCP reads from, this rank's
    verdict on its files (None: clean), and the hook that fetches a file the load needs that `path` lacks."""

    path: Path
    verdict: str | StorageUnavailable | None
    fetch: Callable[[str], None] | None = None


class RunStore(Protocol):
    """One run's checkpoints on one backend, as every rank of a training job uses them. A step is begun
    (`begin`, rank 0: the URI the ranks write to), each rank writes into `rank_files` and `deliver`s there,
    and rank 0 `seal`s it (or `discard`s it); the store also holds the attempt fence, retention, and a
    resume's reads. Raises StorageUnavailable when the storage is out of reach, StorageError for a location it
    cannot use."""

    @property
    def location(self) -> Location:
        """The run's location."""
        ...

    def prepare(self, rank: int, *, staged: bool) -> None:
        """Every rank at start-up: its node-local work space made private (saves that stage, and every save
        on object storage) and emptied of what an interrupted save or resume of this rank left there."""
        ...

    def reachable(self) -> None:
        """Raise StorageUnavailable unless the run's location can be listed (never creates it)."""
        ...

    def probe(self) -> None:
        """Rank 0 at start-up, before the first step: write a small private file (object) in the run's
        location, read it back and remove it (a missing run directory is created). StorageError when the
        location is wrong (cannot be written or read back, the run's directory a link, a write refused to
        these credentials), StorageUnavailable when it is out of reach right now."""
        ...

    def complete(self) -> list[OnDisk]:
        """The run's sealed steps, newest first, each with the hash its marker claims (unverified)."""
        ...

    def quarantined(self) -> list[str]:
        """The URIs of the run's steps set aside as corrupt (kept as evidence)."""
        ...

    def owner(self) -> int:
        """The attempt that last claimed the run (0: none has)."""
        ...

    def claim(self, attempt: int) -> None:
        """Claim the run for `attempt` (never lowers a claim); Fenced when a newer attempt holds it."""
        ...

    def check(self, attempt: int) -> None:
        """Raise Fenced when a newer attempt than `attempt` has claimed the run."""
        ...

    def clean(self) -> list[str]:
        """Rank 0 at start-up: remove the run's stale partial steps (no live writer owns them); what went."""
        ...

    def confined(self, uri: str) -> str | None:
        """`uri` when it names a step location directly under the run's own, else None (refused unread)."""
        ...

    def read_manifest(self, uri: str, expected_hash: str | None, *, run_id: str, step: int) -> Manifest | str:
        """The manifest of the (confined) step at `uri` when its marker and digest check out, else why not."""
        ...

    def readable(
        self, uri: str, manifest: Manifest, files: Sequence[FileEntry], *, start: str, rank: int
    ) -> AbstractContextManager[Readable]:
        """This rank's `files` of the step at `uri` readable locally and judged (each byte read once, hashed);
        `start` names this start's downloads. What it made local is removed on exit."""
        ...

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        """Move the step out of its name, kept as evidence; its new URI, None if it was gone."""
        ...

    def begin(self, step: int, attempt: int) -> str:
        """Rank 0: start saving `step` for `attempt`; the URI every rank delivers to. An older attempt's
        sealed step of that name (never recorded by this one) is set aside, here or at `seal`."""
        ...

    def rank_files(
        self, uri: str, step: int, rank: int, *, staged: bool
    ) -> AbstractContextManager[RankFiles]:
        """Where this rank writes its files of the step begun at `uri` (`staged`: from a staged copy, in the
        background); a private local directory is removed on exit."""
        ...

    def deliver(self, uri: str, written: RankFiles, entries: Sequence[FileEntry]) -> None:
        """Move this rank's written files (their digests known from the write) into the step at `uri`."""
        ...

    def seal(self, uri: str, manifest: Manifest, attempt: int) -> StoredCheckpoint:
        """Rank 0, once every rank delivered: manifest, then marker; the step is complete. Fenced when a newer
        attempt holds the run (nothing sealed)."""
        ...

    def discard(self, uri: str) -> None:
        """Remove what a failed save left at `uri` (best effort: `clean` finishes the rest)."""
        ...

    def prune(self, steps: Collection[int], attempt: int) -> list[int]:
        """Delete the sealed steps of `steps` (retention's decision: `workers.layout.retire`); those found
        and deleted. Fenced when a newer attempt holds the run: it prunes for itself."""
        ...
