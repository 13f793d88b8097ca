"""Loading one candidate checkpoint on every rank: the verdicts combined, then DCP through the verified reader.

Each rank judges the files it owns (its own shards; rank 0 also `.metadata` and the rest), so each byte is
checked once in the job; the verdicts are combined so all ranks take the same way: storage out of reach stops
the job, a defect skips the candidate, and only when every verdict is clean does DCP load, never parsing an
unverified byte, its pickles through the allowlist. Every backend's resume goes through here.
"""

import re
from pathlib import Path

import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ftrain.errors import ResumeFailed as ResumeFailed
from ftrain.errors import ResumeRefused, StoppedByCredentials
from ftrain.errors import ResumeStopped as ResumeStopped
from ftrain.train.loaders import world_change_refusal
from ftrain.train.state import TrainState
from ftrain.workers.dcp_reader import (
    METADATA,
    Rejected,
    RestrictedLoadPlanner,
    VerifiedReader,
    parse_metadata,
)
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.port import Readable
from ftrain.workers.storage.storage_errors import MissingCredentials, StorageUnavailable
from ftrain.workers.unpickle import RefusedPickle

_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")
log = structlog.get_logger(__name__)

Verdict = str | StorageUnavailable | None
"""One rank's judgement: None (clean), why the checkpoint is refused, or the storage out of reach."""


def owned(files: tuple[FileEntry, ...], rank: int, world: int) -> list[FileEntry]:
    """The files `rank` verifies: the shards `__<r>_*.distcp` it wrote (r mod world), rank 0 the rest."""
    mine = []
    for entry in files:
        match = _SHARD.search(entry.name)
        owner = int(match.group(1)) % world if match else 0
        if owner == rank:
            mine.append(entry)
    return mine


def check_world(world_change: str, state: TrainState, manifest: Manifest, world: int) -> None:
    """Every rank, before loading: a resume on another world whose data position is per rank (or absent) is
    refused (ResumeRefused, nothing loaded or trained), or with `world_change="warn"` goes on, said once."""
    refusal = world_change_refusal(state.data, manifest.world_size, world, manifest.step)
    if refusal is None:
        return
    if world_change == "refuse":
        raise ResumeRefused(refusal)
    if dist.get_rank() == 0:
        log.warning("world_changed_data_per_rank", detail=refusal)


def load_verified(
    local: Readable, manifest: Manifest, state: TrainState, group: dist.ProcessGroup
) -> str | None:
    """Combine every rank's verdict on the files it made readable; only when all are clean, and `.metadata`
    (read by rank 0, sent to every rank) matches its entry, does DCP load from `local.path`, through
    `local.fetch` for a file the path lacks. Returns the combined verdict, the same on every rank (None:
    loaded)."""
    if reason := combined(local.verdict, group):
        return reason
    metadata = _shared_metadata(local.path, manifest.files, group)
    if reason := combined(None if isinstance(metadata, Metadata) else metadata, group):
        return reason
    assert isinstance(metadata, Metadata)
    world = dist.get_world_size()
    if manifest.world_size != world:
        log.warning("world_size_changed", saved=manifest.world_size, now=world)
    state.restore_rng = manifest.world_size == world  # per-rank RNG streams exist for the ranks that saved
    refused = None
    try:
        dcp_load(
            {"app": state},
            storage_reader=VerifiedReader(local.path, metadata, local.fetch),
            planner=RestrictedLoadPlanner(),
            process_group=group,
        )
    except CheckpointException as exc:  # raised on every rank, with every rank's failure
        return load_failure(local.path, exc)
    except RefusedPickle as exc:  # this rank's own state (an old RNG pickle): the others must hear of it
        refused = str(exc)
    finally:
        state.restore_rng = True
    return combined(refused, group)


def _shared_metadata(
    path: Path, files: tuple[FileEntry, ...], group: dist.ProcessGroup
) -> Metadata | str | StorageUnavailable:
    """`.metadata` as rank 0 holds it (verified with its own files), sent to every rank, each of which parses
    the bytes only once they match the manifest entry: on object storage the other nodes never downloaded it."""
    raw: bytes | StorageUnavailable = b""
    if dist.get_rank() == 0 and any(f.name == METADATA for f in files):
        try:
            raw = (path / METADATA).read_bytes()
        except OSError as exc:
            raw = StorageUnavailable(f"{path}: {exc}")
    box: list[bytes | StorageUnavailable] = [raw]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0] if isinstance(box[0], StorageUnavailable) else parse_metadata(box[0], files)


def combined(verdict: Verdict, group: dist.ProcessGroup) -> str | None:
    """Every rank's verdict, combined the same way on each: storage out of reach stops the job, else the
    first rank's reason (None: all clean)."""
    verdicts: list[Verdict] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, verdict, group=group)
    if unavailable := next((v for v in verdicts if isinstance(v, StorageUnavailable)), None):
        raise stopped(unavailable)
    return next((r for r in verdicts if isinstance(r, str)), None)


def stopped(exc: StorageUnavailable) -> ResumeStopped:
    """What every rank raises (each saw the same verdict) when the storage was out of reach: credentials it
    found none of or refused say what to fix."""
    if isinstance(exc, MissingCredentials):
        return StoppedByCredentials(
            f"{exc}; nothing recorded, the checkpoints are untouched: set the storage's credentials (the AWS "
            "chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials) and start again"
        )
    return ResumeStopped(f"{exc}; nothing recorded, the checkpoints are untouched")


def load_failure(path: Path, exc: CheckpointException) -> str:
    """What a failed DCP load means, the same on every rank (each holds every rank's failure): a file
    fetched for the load out of reach stops the job, one that failed its check or a pickle refused by the
    allowlist skips the checkpoint, anything else is a failure outside it (ResumeFailed)."""
    failures = [exc.failures[rank][0] for rank in sorted(exc.failures)]
    if unavailable := next((f for f in failures if isinstance(f, StorageUnavailable)), None):
        raise stopped(unavailable) from exc
    if refused := next((f for f in failures if isinstance(f, RefusedPickle | Rejected)), None):
        return str(refused)
    first = failures[0]
    raise ResumeFailed(
        f"loading {path} failed, not a corrupt checkpoint: {type(first).__name__}: {first}"
    ) from exc
