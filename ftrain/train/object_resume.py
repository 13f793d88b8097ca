"""Resume from object storage (S3): plan from the log or the bucket, download only what each rank owns, load.

A candidate step is downloaded into one cache per node, shared by the node's ranks: each rank fetches only the
files it owns (`owned`), in parallel ranged reads hashed as they arrive, so every byte crosses the network and
is hashed once in the job. The cache is made by whichever rank of the node gets there first (`claim_dir`),
which also removes it, after the load's last collective, when no rank of the job reads it any more; on a work
directory shared by several nodes they simply share one cache. Once every rank's verdict is clean, DCP loads
from the cache; a file the load needs that its node lacks (its owner is on another node) is fetched whole and
verified before a byte of it is parsed.
"""

import os
import time
from contextlib import suppress
from pathlib import Path

import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata

from ftrain import settings
from ftrain.projections.lifecycle import (
    Candidate,
    ResumePlan,
    RunState,
    SkipIntent,
    plan_resume,
    skipped_line,
)
from ftrain.train.config import CheckpointConfig
from ftrain.train.object_store import fetch_dir, stale_caches
from ftrain.train.resume_load import (
    Verdict,
    combined,
    in_place_restarts,
    load_verified,
    owned,
    record_in_place,
)
from ftrain.train.state import TrainState
from ftrain.workers.checkpoint_dir import OUTSIDE_RUN, StorageError, StorageUnavailable
from ftrain.workers.dcp_reader import METADATA, Rejected, parse_metadata
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.nofollow import remove_dir
from ftrain.workers.recorder import Recorder
from ftrain.workers.stage_dir import claim_dir, safe_stage_dir
from ftrain.workers.storage import s3_fence
from ftrain.workers.storage.s3_store import S3Storage

log = structlog.get_logger(__name__)


def plan_object(
    config: CheckpointConfig,
    recorder: Recorder | None,
    state: RunState | None,
    storage: S3Storage,
    run_name: str,
) -> tuple[ResumePlan, int] | str:
    """Rank 0: the lifecycle's plan from the log or the bucket's sealed steps, and the attempt; or why the
    start is refused. The run is claimed for the attempt (`s3_fence`, as on a file system: an older attempt
    that wakes up then seals nothing), the run's stale partial work is removed (unmarked steps no live writer
    owns, their multipart uploads aborted), and what the plan sets aside is copied out of the step names (kept)."""
    assert config.object_dir is not None
    location = config.object_dir.rstrip("/")
    if state is not None and f"{state.launch.storage.rstrip('/')}/{state.run_id}" != location:
        return (
            f"checkpoint location {location} is not run {state.run_id}'s "
            f"({state.launch.storage.rstrip('/')}/{state.run_id}, under the storage root it was launched with)"
        )
    restarts = in_place_restarts(state, config)
    plan = plan_resume(
        state,
        storage.complete(run_name),
        forced=True,
        fresh=not config.resume,
        failed_in_place=bool(restarts),
    )
    opened = settings.attempt()
    record_in_place(recorder, state, restarts, opened)
    current = state.attempt if state is not None else s3_fence.owner(storage, run_name)  # log out of reach
    attempt = opened or ((current + (1 if plan.candidates or plan.restart else 0)) if config.run_id else 0)
    if attempt:
        s3_fence.claim(storage, run_name, attempt)
    storage.clean(run_name)
    stamp = str(int(time.time()))
    for unrecorded in plan.unrecorded:
        log.warning("unrecorded_checkpoint_set_aside", uri=unrecorded.uri)
        storage.quarantine(unrecorded.uri, "unrecorded", stamp)
    for old in plan.superseded:
        storage.quarantine(old.uri, "superseded", stamp)
    return plan, attempt


def header_object(
    storage: S3Storage, candidate: Candidate, run_id: str
) -> Manifest | str | StorageUnavailable:
    """Rank 0's reading of the candidate's marker and manifest (nothing is read when its URI is not a step of
    the run's own); storage out of reach is sent, not raised."""
    try:
        uri = storage.confined(candidate.uri, run_id)
        if uri is None:
            return OUTSIDE_RUN
        return storage.read_manifest(uri, candidate.digest, run_id=run_id, step=candidate.step)
    except StorageUnavailable as exc:
        return exc
    except StorageError as exc:
        return str(exc)


def skip_object(storage: S3Storage, candidate: Candidate, reason: str, recorder: Recorder | None) -> None:
    """Record the refusal and set the step aside (copied, kept as evidence)."""
    if recorder is not None:
        recorder.record(
            SkipIntent(checkpoint_hash=candidate.digest or "", step=candidate.step, reason=reason)
        )
    if reason != OUTSIDE_RUN:
        try:
            storage.quarantine(candidate.uri, "corrupt", f"{int(time.time())}")
        except (StorageUnavailable, StorageError) as exc:
            log.warning("set_aside_failed", uri=candidate.uri, error=str(exc))
    print(skipped_line(candidate.step, reason), flush=True)


def load_object(
    storage: S3Storage,
    uri: str,
    manifest: Manifest,
    state: TrainState,
    work: Path,
    cache_name: str,
    group: dist.ProcessGroup,
) -> str | None:
    """Every rank downloads the files it owns into its node's cache `work/cache_name`, hashing them as they
    arrive; only when every rank's files matched does DCP load from there. Returns the combined verdict,
    the same on every rank (None: loaded). The rank that made the cache removes it after."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cache, scratch = work / cache_name, fetch_dir(work, rank)
    created = False
    try:
        mine = owned(manifest.files, rank, world)
        try:
            created = claim_dir(work, cache_name)
            if created:
                _remove(work, stale_caches(work, cache_name))
            verdict: Verdict = storage.fetch(uri, mine, cache)
        except StorageUnavailable as exc:
            verdict = exc
        except OSError as exc:  # the local cache, not the checkpoint
            verdict = StorageUnavailable(f"local cache {cache}: {exc}")
        log.info(
            "resume_downloaded", rank=rank, uri=uri, files=[e.name for e in mine], verdict=str(verdict or "")
        )
        if reason := combined(verdict, group):
            return reason
        metadata = _shared_metadata(cache, manifest.files, group)
        fetch = FetchForLoad(storage, uri, manifest.files, cache, scratch, rank)
        # DCP's last collective ends after every rank's reads: past it, no rank reads the cache
        return load_verified(cache, manifest, state, group, metadata, fetch)
    finally:
        _remove(scratch.parent, [scratch.name])
        # the rank's directory the scratch was made in goes too, unless something else is in it
        with suppress(OSError):
            scratch.parent.rmdir()
        if created:
            _remove(work, [cache_name])


def _shared_metadata(
    cache: Path, files: tuple[FileEntry, ...], group: dist.ProcessGroup
) -> Metadata | str | StorageUnavailable:
    """`.metadata` as rank 0 downloaded it (with its own files, in its node's cache), sent to every rank,
    each of which parses the bytes it holds only once they match the manifest entry."""
    raw: bytes | StorageUnavailable = b""
    if dist.get_rank() == 0 and any(f.name == METADATA for f in files):
        try:
            raw = (cache / METADATA).read_bytes()
        except OSError as exc:
            raw = StorageUnavailable(f"local cache {cache}: {exc}")
    box: list[bytes | StorageUnavailable] = [raw]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0] if isinstance(box[0], StorageUnavailable) else parse_metadata(box[0], files)


class FetchForLoad:
    """The load's fetch hook: a file this rank's plan reads that its node's cache lacks (its owner is on
    another node) is downloaded whole into this rank's scratch directory, verified there, and only then
    renamed into the cache, so the ranks of a node never see each other's partial bytes. A defect raises
    Rejected, storage out of reach StorageUnavailable: DCP hands either to every rank."""

    def __init__(
        self,
        storage: S3Storage,
        uri: str,
        files: tuple[FileEntry, ...],
        cache: Path,
        scratch: Path,
        rank: int,
    ) -> None:
        self.storage, self.uri, self.cache, self.scratch, self.rank = storage, uri, cache, scratch, rank
        self.entries = {entry.name: entry for entry in files}

    def __call__(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            raise Rejected(f"DCP metadata names file {name!r}, which the manifest does not list")
        try:
            if os.path.lexists(self.cache / name):  # downloaded and verified by a rank of this node
                return
            safe_stage_dir(self.scratch)
            if verdict := self.storage.fetch(self.uri, [entry], self.scratch):
                raise Rejected(verdict)
            os.rename(self.scratch / name, self.cache / name)
        except OSError as exc:
            raise StorageUnavailable(f"local cache {self.cache}: {exc}") from exc
        log.info("fetched_for_load", rank=self.rank, uri=self.uri, file=name, size=entry.size)


def _remove(parent: Path, names: list[str]) -> None:
    """Remove directories of ours (never following a link); what cannot be removed is logged."""
    for name in names:
        try:
            remove_dir(parent, name)
        except OSError as exc:
            log.warning("cache_not_removed", path=str(parent / name), error=str(exc))
