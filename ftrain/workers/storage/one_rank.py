"""A writer of one process, outside the run's attempts (the CLI's `checkpoint`): the step writer's call order
with one rank whose files are at hand, so a step the CLI writes is made as the trainer's are."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ftrain.workers.integrity import ALGORITHM
from ftrain.workers.manifest import Manifest
from ftrain.workers.storage.port import Source, StepWriter, StoredCheckpoint
from ftrain.workers.storage.storage_errors import CheckpointExists


def write_step(
    writer: StepWriter,
    *,
    run_id: str,
    step: int,
    epoch: int,
    shards: int,
    sources: Sequence[Source],
    world_size: int = 1,
    dataset_revision: str | None = None,
    extra: dict[str, Any] | None = None,
    algorithm: str = ALGORITHM,
) -> StoredCheckpoint:
    """Begin the step, put the data files (hashed by `algorithm`), seal it (manifest, then marker). CheckpointExists when the step is
    taken (another writer sealed or claimed it, or an interrupted write is in the way); nothing of this
    writer's is left behind on failure."""
    uri = writer.begin(step, None)
    try:
        entries = [writer.put(uri, name, source, algorithm) for name, source in sources]
        manifest = Manifest(
            run_id=run_id,
            step=step,
            epoch=epoch,
            shards=shards,
            world_size=world_size,
            dataset_revision=dataset_revision,
            created_at=datetime.now(UTC),
            files=tuple(entries),
            extra=extra or {},
        )
        return writer.seal(uri, manifest, None)
    except CheckpointExists:  # what is there now is another writer's: leave it
        raise
    except BaseException:
        writer.discard(uri)
        raise
