"""Loading one candidate checkpoint on every rank: rank 0's header shared, the world checked, the verdicts
combined, then DCP through the verified reader.

Each rank judges the files it owns (its own shards; rank 0 also `.metadata` and the rest), so each byte is
checked once in the job; the verdicts are combined so all ranks take the same way: storage out of reach stops
the job (StorageUnavailable, raised alike on every rank; `resume` stops on it), a defect skips the candidate,
and only when every verdict is clean does DCP load, never parsing an unverified byte, its pickles through the
allowlist (files with chunk digests verified chunk by chunk as DCP reads them, where the backend left them
for the load). Every backend's resume goes through here.
"""

import re
from pathlib import Path

import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ftrain.domain.lifecycle import rank_count
from ftrain.errors import ResumeFailed as ResumeFailed
from ftrain.errors import ResumeRefused, StoppedByCredentials
from ftrain.errors import ResumeStopped as ResumeStopped
from ftrain.train.agreement import rank_zeros
from ftrain.train.loaders import DataSource
from ftrain.train.state import TrainState
from ftrain.workers.dcp_reader import (
    Rejected,
    RestrictedLoadPlanner,
    VerifiedReader,
    combined,
    shared_metadata,
    unchecked,
)
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.port import Header, StepReader
from ftrain.workers.storage.storage_errors import MissingCredentials, StorageUnavailable
from ftrain.workers.unpickle import RefusedPickle

_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")
log = structlog.get_logger(__name__)


def owned(files: tuple[FileEntry, ...], rank: int, world: int) -> list[FileEntry]:
    """The files `rank` verifies: the shards `__<r>_*.distcp` it wrote (r mod world), rank 0 the rest."""
    mine = []
    for entry in files:
        match = _SHARD.search(entry.name)
        owner = int(match.group(1)) % world if match else 0
        if owner == rank:
            mine.append(entry)
    return mine


def load_candidate(
    header: Header | None,
    reader: StepReader,
    state: TrainState,
    world_change: str,
    start: str,
    group: dist.ProcessGroup,
) -> Manifest | str:
    """Every rank: rank 0's `header` (None on the others) shared, the world checked, then the candidate
    loaded, verified (`load_verified`). Returns the manifest loaded, or why the candidate is refused: the same
    on every rank. Raises StorageUnavailable, on every rank alike, when the storage is out of reach."""
    shared = rank_zeros(header, group)
    manifest = shared.manifest
    if isinstance(manifest, StorageUnavailable):
        raise manifest
    if isinstance(manifest, str):
        return manifest
    assert shared.uri is not None  # a manifest is only read at a URI confined to the run's own
    check_world(world_change, state, manifest, dist.get_world_size())
    reason = load_verified(reader, shared.uri, manifest, state, start, group)
    return manifest if reason is None else reason


def check_world(world_change: str, state: TrainState, manifest: Manifest, world: int) -> None:
    """Every rank, before loading: a resume on another world whose data position is per rank (or absent) is
    refused (ResumeRefused, nothing loaded or trained), or with `world_change="warn"` goes on, said once."""
    refusal = world_change_refusal(state.data, manifest.world_size, world, manifest.step)
    if refusal is None:
        return
    if world_change == "refuse":
        raise ResumeRefused(
            f"{refusal}; resume on {rank_count(manifest.world_size)}, or give the loader a global data "
            "position (ftrain.train.sampler.GlobalSampler as its batch_sampler), or pass world_change='warn' "
            "to go on anyway"
        )
    if dist.get_rank() == 0:
        log.warning("world_changed_data_per_rank", detail=f"{refusal}; going on, as world_change='warn' asks")


def world_change_refusal(source: DataSource | None, saved_world: int, world: int, step: int) -> str | None:
    """Why a resume from a checkpoint saved by `saved_world` ranks cannot go on with `world` (None: it can):
    a data state that is per rank, or none at all, would skip or repeat samples on another world."""
    if saved_world == world or (source is not None and source.position is not None):
        return None
    what = (
        f"the loader {source.name} keeps a per-rank position"
        if source is not None and source.saved is not None
        else "no loader with a global data position was given (loader=)"
        if source is None
        else f"the loader {source.name} has no state to resume"
    )
    return (
        f"step {step} was saved by {rank_count(saved_world)} and this start has {world}: {what}, so samples "
        "would be skipped or seen twice"
    )


def load_verified(
    reader: StepReader,
    uri: str,
    manifest: Manifest,
    state: TrainState,
    start: str,
    group: dist.ProcessGroup,
) -> str | None:
    """Every rank makes the files it owns readable (`start` names this start's downloads) and judges them;
    only when every rank's verdict is clean, and `.metadata` (read by rank 0, sent to every rank) matches its
    entry, does DCP load from the readable path, through its fetch hook for a file the path lacks. Returns
    the combined verdict, the same on every rank (None: loaded); raises StorageUnavailable as `combined`."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = owned(manifest.files, rank, world)
    with reader.readable(uri, manifest, mine, start=start, rank=rank) as local:
        if reason := combined(local.verdict, group):
            return reason
        metadata = shared_metadata(local.path, manifest.files, group)
        if reason := combined(None if isinstance(metadata, Metadata) else metadata, group):
            return reason
        assert isinstance(metadata, Metadata)
        if manifest.world_size != world:
            log.warning("world_size_changed", saved=manifest.world_size, now=world)
        # per-rank RNG streams exist for the ranks that saved
        state.restore_rng = manifest.world_size == world
        refused = None
        try:
            dcp_load(
                {"app": state},
                storage_reader=VerifiedReader(
                    local.path,
                    metadata,
                    local.fetch,
                    unchecked(manifest.files, mine, local.left, local.source) if local.chunked else None,
                ),
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
