"""The file-system backend of the storage port (local disk, NFS, Lustre, GPFS): `workers.checkpoint_dir`
behind the port's URI-addressed face, behaviour unchanged."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftrain.domain.lifecycle import OnDisk
from ftrain.workers import checkpoint_dir as fs
from ftrain.workers.layout import SetAsideKind, run_dir
from ftrain.workers.storage.port import Source, StoredCheckpoint


class FileStorage:
    """Checkpoints under a directory."""

    def __init__(self, root: Path) -> None:
        self.path = root

    @property
    def root(self) -> str:
        return fs.path_uri(self.path)

    def run_path(self, run_id: str) -> Path:
        """The run's own directory."""
        return run_dir(self.path, run_id)

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
        written = fs.write_checkpoint(
            self.path,
            run_id=run_id,
            step=step,
            epoch=epoch,
            shards=shards,
            sources=sources,
            world_size=world_size,
            dataset_revision=dataset_revision,
            extra=extra,
        )
        return StoredCheckpoint(written.uri, written.manifest, written.checkpoint_hash)

    def complete(self, run_id: str) -> list[OnDisk]:
        return fs.on_disk(self.run_path(run_id))

    def confined(self, uri: str, run_id: str) -> str | None:
        path = fs.confined(uri, self.run_path(run_id))
        return fs.path_uri(path) if path else None

    def verify(
        self, uri: str, expected_hash: str, *, run_id: str | None = None, step: int | None = None
    ) -> str | None:
        return fs.verify_checkpoint(fs.uri_path(uri), expected_hash, run_id=run_id, step=step)

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        moved = fs.set_aside(fs.uri_path(uri), kind, tag)
        return fs.path_uri(moved) if moved else None

    def delete(self, uri: str) -> None:
        fs.remove_checkpoint(fs.uri_path(uri))

    def clean(self, run_id: str) -> list[str]:
        return [fs.path_uri(p) for p in fs.remove_dead_assemblies(self.run_path(run_id))]
