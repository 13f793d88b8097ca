"""Event builders shared by tests."""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from ftrain.domain.lifecycle import CompleteIntent, FailIntent, RunState, apply
from ftrain.events.chain import ChainHead
from ftrain.events.schema import AnyEvent, Checkpointed, Launched
from ftrain.events.signed_log import process_actor
from ftrain.workers.manifest import Manifest
from ftrain.workers.storage.file.run_dir import FileRun
from ftrain.workers.storage.location import Location, path_uri, uri_path
from ftrain.workers.storage.one_rank import write_step

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SIGNER = "{0.user}@{0.host}".format(process_actor())
"""The name a test's own signing key is trusted under (made on first use, as for a user)."""


class WrittenCheckpoint(msgspec.Struct, frozen=True):
    """A checkpoint written whole on a file system: its directory too."""

    path: Path
    uri: str
    manifest: Manifest
    checkpoint_hash: str


def write_checkpoint(
    root: Path,
    *,
    run_id: str,
    step: int,
    epoch: int,
    shards: int,
    sources: Sequence[tuple[str, bytes | Path]],
    **manifest: Any,
) -> WrittenCheckpoint:
    """The checkpoint of `run_id` at `step` under the storage root `root`, written as `ftrain checkpoint`
    writes it (the port's one-rank writer on the file system)."""
    writer = FileRun(Location("file", path_uri(root), run_id))
    stored = write_step(
        writer, run_id=run_id, step=step, epoch=epoch, shards=shards, sources=sources, **manifest
    )
    return WrittenCheckpoint(uri_path(stored.uri), stored.uri, stored.manifest, stored.checkpoint_hash)


def launched(run_id: str, project: str = "p") -> Launched:
    """A minimal launched event."""
    return Launched(run_id=run_id, project=project, strategy="fsdp", nodes=1, gpus_per_node=1, hosts=("localhost",),
                    allocation_source="localhost", rdzv_endpoint="localhost:29500", command=("torchrun",),
                    storage="file:///tmp")  # fmt: skip


def checkpointed(run_id: str, step: int) -> Checkpointed:
    """A checkpointed event pointing at no real files (the store and the fold do not look at them): its
    directory is absent from a listable one, so a resume finds it corrupt, not the storage unavailable."""
    return Checkpointed(run_id=run_id, step=step, epoch=step // 10, shards=1, uri=f"file:///tmp/absent-step-{step}",
                        checkpoint_hash=f"{step:064x}", size_bytes=step)  # fmt: skip


def written_checkpoint(storage: Path, run_id: str, step: int) -> Checkpointed:
    """A checkpointed event backed by a complete checkpoint directory under `storage`, which verifies."""
    written = write_checkpoint(storage, run_id=run_id, step=step, epoch=step // 10, shards=1,
                               sources=[("state.json", f'{{"step": {step}}}'.encode())])  # fmt: skip
    return Checkpointed(run_id=run_id, step=step, epoch=step // 10, shards=1, uri=written.uri,
                        checkpoint_hash=written.checkpoint_hash, size_bytes=written.manifest.size_bytes)  # fmt: skip


def fold(*events: AnyEvent) -> RunState:
    """The state after `events`, the n-th stamped seq n at T0 + n minutes."""
    state: RunState | None = None
    for n, event in enumerate(events, start=1):
        stamped = msgspec.structs.replace(event, seq=n, time=T0 + timedelta(minutes=n))
        state = apply(state, stamped, ChainHead(n, f"{n:064x}", n))
    assert state is not None
    return state


class Intents:
    """A supervisor's recorder that keeps what it was given."""

    def __init__(self) -> None:
        self.intents: list[FailIntent | CompleteIntent] = []

    def record(self, intent: FailIntent | CompleteIntent) -> str:
        self.intents.append(intent)
        return str(len(self.intents))

    def flush(self, timeout: float) -> bool:
        return True
