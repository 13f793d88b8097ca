"""Automatic resume at trainer start-up: every rank agrees on one checkpoint, verified by all of them.

Rank 0 plans with the lifecycle's `plan_resume`, the same plan `ftrain resume` executes: the candidates,
newest first, are the checkpoints the log says are valid (after flushing what the previous attempt left in
the outbox), or, with the log out of reach, the directories whose marker and manifest agree. Rank 0 checks a candidate's marker and manifest; every rank hashes the files it owns (its
own shards; rank 0 also `.metadata`), in threads and all at once, so each byte is hashed once in the job. The
verdicts are combined, so all ranks fall back together. An invalid checkpoint is recorded
as `corrupt_skipped` and set aside; when checkpoints exist and none is valid, every rank raises
NoValidCheckpoint (never a silent fresh start).
"""

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import msgspec
import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from events.private import private_dir
from ftrain import settings
from ftrain.train.config import CheckpointConfig
from ftrain.train.object_store import cache_dir, run_storage
from ftrain.train.run_log import RunBroken, RunUnknown, read_run
from ftrain.train.state import TrainState
from projections.lifecycle import (
    Candidate,
    FailIntent,
    IllegalTransition,
    ResumeIntent,
    ResumePlan,
    RunState,
    SkipIntent,
    plan_resume,
    skipped_line,
)
from workers.checkpoint_dir import (
    OUTSIDE_RUN,
    StorageError,
    StorageUnavailable,
    confined,
    marker_hash,
    on_disk,
    read_manifest,
    require_listable,
    set_aside,
    uri_path,
    verify_files,
)
from workers.dcp_reader import RestrictedLoadPlanner, VerifiedReader, load_metadata
from workers.fence import Fenced, claim, owner
from workers.layout import assemblies, run_dir
from workers.manifest import FileEntry, Manifest
from workers.nofollow import remove_dir
from workers.recorder import Recorder
from workers.storage import s3_fence
from workers.storage.open import is_object_storage
from workers.storage.s3_store import S3Storage
from workers.unpickle import ForbiddenPickle

FLUSH_TIMEOUT = 15.0
LOG_TIMEOUT = 15.0
_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")
log = structlog.get_logger(__name__)
T = TypeVar("T")


class NoValidCheckpoint(RuntimeError):
    """Checkpoints exist and none of them verified: the job must stop, not start over."""


class ResumeRefused(RuntimeError):
    """The start-up request contradicts the log (e.g. --no-resume on a run that has checkpoints)."""


class ResumeStopped(RuntimeError):
    """The log or the storage cannot be trusted right now (a broken chain, storage out of reach): stop on
    every rank, recording nothing and setting nothing aside; a later start, once it is fixed, resumes."""


class ResumeFailed(RuntimeError):
    """Loading a checkpoint failed for a reason outside it (memory, I/O): stop, and skip nothing."""


class ResumePoint(msgspec.Struct, frozen=True):
    """Where training continues: the checkpoint's step and epoch."""

    step: int
    epoch: int


class StartDecision(msgspec.Struct, frozen=True):
    """Rank 0's decision, broadcast to every rank: the lifecycle's plan and the attempt this job records in,
    or why the start is refused (the request contradicts the log) or stopped (the log or the storage cannot
    be trusted)."""

    plan: ResumePlan = ResumePlan()
    attempt: int = 0
    refused: str | None = None
    stopped: str | None = None
    run_dir: str = ""
    """The run's own directory: a candidate is tried only when its URI names a directory directly in it."""


def cleanup_stale(ckpt_dir: Path, stage_root: Path | None, rank: int) -> None:
    """Remove what an interrupted save left: `.step-N.tmp` directories (with their `.partial` files) of the
    run, by rank 0, and each rank's node-local staging directory. A link there is removed, never followed:
    the next save would write through it."""
    stale = assemblies(ckpt_dir) if rank == 0 and ckpt_dir.is_dir() else []
    if stage_root is not None:
        stale.append(stage_root)
    for path in stale:
        try:
            if remove_dir(path.parent, path.name, unlink_link=True):
                log.info("stale_staging_removed", path=str(path))
        except OSError as exc:
            log.warning("stale_staging_not_removed", path=str(path), error=str(exc))


def resume(
    config: CheckpointConfig, state: TrainState, recorder: Recorder | None, group: dist.ProcessGroup
) -> tuple[ResumePoint | None, int]:
    """Load the newest valid checkpoint into `state` on every rank; returns where training continues (None:
    from the start) and the attempt this job records in (0: no log to say)."""
    rank = dist.get_rank()
    decision = _broadcast(_safe_plan(config, recorder) if rank == 0 else None, group)
    if decision.refused:
        raise ResumeRefused(decision.refused)
    if decision.stopped:
        raise ResumeStopped(decision.stopped)
    plan, attempt, run = decision.plan, decision.attempt, Path(decision.run_dir)
    objects = run_storage(config.object_dir)[0] if config.object_dir else None
    for candidate in plan.candidates:
        header = cast(
            Manifest | str | StorageUnavailable,
            _broadcast(
                (
                    _header_object(objects, candidate, _run_id(config))
                    if objects
                    else _header(run, candidate, _run_id(config))
                )
                if rank == 0
                else None,
                group,
            ),
        )
        if isinstance(header, StorageUnavailable):
            raise _stopped(header)
        if objects is not None:
            reason = (
                header
                if isinstance(header, str)
                else _load_object(objects, candidate.uri, header, state, config, group)
            )
            if reason is None:
                return _resumed(None, candidate, state, recorder, attempt), attempt
            if rank == 0:
                _skip_object(objects, candidate, reason, recorder)
            continue
        path = run / uri_path(candidate.uri).name  # rank 0 found the URI names this directory
        reason = header if isinstance(header, str) else _load(path, header, state, group)
        if reason is None:
            assert isinstance(header, Manifest)
            return _resumed(path, candidate, state, recorder, attempt), attempt
        if rank == 0:
            _skip(candidate, reason, recorder, None if reason == OUTSIDE_RUN else path)
    if plan.had_checkpoints:
        raise NoValidCheckpoint(
            f"no valid checkpoint among {len(plan.candidates)} candidate(s) in "
            f"{config.object_dir or config.ckpt_dir}; "
            "refusing to start over"
        )
    if plan.restart and recorder is not None:
        recorder.record(ResumeIntent(checkpoint_hash=None, step=0, attempt=attempt))
    return None, attempt


def owned(files: tuple[FileEntry, ...], rank: int, world: int) -> list[FileEntry]:
    """The files `rank` verifies: the shards `__<r>_*.distcp` it wrote (r mod world), rank 0 the rest."""
    mine = []
    for entry in files:
        match = _SHARD.search(entry.name)
        owner = int(match.group(1)) % world if match else 0
        if owner == rank:
            mine.append(entry)
    return mine


def _load(
    path: Path,
    manifest: Manifest,
    state: TrainState,
    group: dist.ProcessGroup,
    local: Callable[[], Metadata | str | StorageUnavailable] | None = None,
) -> str | None:
    """Every rank hashes the files it owns (threads, all ranks at once: each byte is read and hashed once in
    the job) and parses `.metadata` from bytes it checked; only when every verdict is clean does DCP load,
    so it never parses an unverified byte, and what it unpickles goes through the allowlist. Returns the
    combined verdict, the same on every rank (None: loaded)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    metadata = local() if local is not None else _local_verdict(path, manifest, rank, world)
    verdict = metadata if isinstance(metadata, str | StorageUnavailable) else None
    if reason := _combined(verdict, group):
        return reason
    assert isinstance(metadata, Metadata)
    if manifest.world_size != world:
        log.warning("world_size_changed", saved=manifest.world_size, now=world)
    state.restore_rng = (
        manifest.world_size == world
    )  # per-rank RNG streams exist for the ranks that saved them
    refused = None
    try:
        dcp_load(
            {"app": state},
            storage_reader=VerifiedReader(path, metadata),
            planner=RestrictedLoadPlanner(),
            process_group=group,
        )
    except CheckpointException as exc:  # raised on every rank, with every rank's failure
        forbidden = next((f[0] for f in exc.failures.values() if isinstance(f[0], ForbiddenPickle)), None)
        if forbidden is None:  # a verified checkpoint failed to load
            raise ResumeFailed(f"loading {path} failed, not a corrupt checkpoint: {_first(exc)}") from exc
        return str(forbidden)
    except ForbiddenPickle as exc:  # this rank's own state (an old RNG pickle): the others must hear of it
        refused = str(exc)
    finally:
        state.restore_rng = True
    return _combined(refused, group)


def _load_object(
    storage: S3Storage,
    uri: str,
    manifest: Manifest,
    state: TrainState,
    config: CheckpointConfig,
    group: dist.ProcessGroup,
) -> str | None:
    """Object storage: every rank downloads the step into its private cache, hashing each file as it arrives,
    and loads from there only when every rank's files matched (the same combined verdict as on a file
    system); the cache is removed after."""
    cache = cache_dir(config.ckpt_dir, dist.get_rank())

    def fetched() -> Metadata | str | StorageUnavailable:
        try:
            shutil.rmtree(cache, ignore_errors=True)
            private_dir(cache, tighten=False)
            return storage.fetch(uri, manifest.files, cache) or load_metadata(cache, manifest.files)
        except StorageUnavailable as exc:
            return exc
        except OSError as exc:  # the local cache, not the checkpoint
            return StorageUnavailable(f"local cache {cache}: {exc}")

    try:
        return _load(cache, manifest, state, group, fetched)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _header_object(
    storage: S3Storage, candidate: Candidate, run_id: str
) -> Manifest | str | StorageUnavailable:
    """Rank 0's reading of the candidate's marker and manifest on object storage (nothing is read when its URI
    is not a step of the run's own); storage out of reach is sent, not raised."""
    try:
        uri = storage.confined(candidate.uri, run_id)
        if uri is None:
            return OUTSIDE_RUN
        return storage.read_manifest(uri, candidate.digest, run_id=run_id, step=candidate.step)
    except StorageUnavailable as exc:
        return exc
    except StorageError as exc:
        return str(exc)


def _skip_object(storage: S3Storage, candidate: Candidate, reason: str, recorder: Recorder | None) -> None:
    """Record the refusal and set the step aside on object storage (copied, kept as evidence)."""
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


def _local_verdict(
    path: Path, manifest: Manifest, rank: int, world: int
) -> Metadata | str | StorageUnavailable:
    """This rank's verdict on its files, then its own verified parse of `.metadata`; storage out of reach
    is returned, not raised, so all ranks stop together."""
    try:
        return verify_files(path, owned(manifest.files, rank, world)) or load_metadata(path, manifest.files)
    except StorageUnavailable as exc:
        return exc


def _combined(verdict: str | StorageUnavailable | None, group: dist.ProcessGroup) -> str | None:
    """Every rank's verdict, combined the same way on each: storage out of reach stops the job, else the
    first rank's reason (None: all clean)."""
    verdicts: list[str | StorageUnavailable | None] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, verdict, group=group)
    if unavailable := next((v for v in verdicts if isinstance(v, StorageUnavailable)), None):
        raise _stopped(unavailable)
    return next((r for r in verdicts if isinstance(r, str)), None)


def _header(run: Path, candidate: Candidate, run_id: str) -> Manifest | str | StorageUnavailable:
    """Rank 0's reading of the candidate's marker and manifest, once its URI is found to name a directory
    of the run's own (else nothing is read); storage out of reach is sent, not raised."""
    try:
        path = confined(candidate.uri, run)
        if path is None:
            return OUTSIDE_RUN
        return read_manifest(path, candidate.digest, run_id=run_id, step=candidate.step)
    except StorageUnavailable as exc:
        return exc


def _run_id(config: CheckpointConfig) -> str:
    """The run id the trainer's manifests carry (without a log, the directory's name)."""
    if config.run_id:
        return config.run_id
    return config.object_dir.rstrip("/").rpartition("/")[2] if config.object_dir else config.ckpt_dir.name


def _stopped(exc: StorageUnavailable) -> ResumeStopped:
    """What every rank raises (each saw the same verdict) when the storage was out of reach."""
    return ResumeStopped(f"{exc}; nothing recorded, the checkpoints are untouched")


def _first(exc: CheckpointException) -> str:
    """The lowest failing rank's error, in one line."""
    error = exc.failures[min(exc.failures)][0]
    return f"{type(error).__name__}: {error}"


def _resumed(
    path: Path | None, candidate: Candidate, state: TrainState, recorder: Recorder | None, attempt: int
) -> ResumePoint:
    point = ResumePoint(state.step, state.epoch)
    if dist.get_rank() == 0:
        if recorder is not None:
            digest = candidate.digest or (marker_hash(path) if path else None) or ""
            recorder.record(ResumeIntent(checkpoint_hash=digest, step=point.step, attempt=attempt))
        print(f"RESUMED from step={point.step} (epoch={point.epoch})", flush=True)
    return point


def _skip(candidate: Candidate, reason: str, recorder: Recorder | None, path: Path | None) -> None:
    """Record the refusal and set the checkpoint aside; one outside the run's directory (`path` None) is
    neither read nor moved."""
    digest = candidate.digest or (marker_hash(path) if path else None) or ""
    if recorder is not None:
        recorder.record(SkipIntent(checkpoint_hash=digest, step=candidate.step, reason=reason))
    if path is not None:
        try:
            set_aside(path, "corrupt", f"{int(time.time())}")
        except OSError as exc:
            log.warning("set_aside_failed", path=str(path), error=str(exc))
    print(skipped_line(candidate.step, reason), flush=True)


def _safe_plan(config: CheckpointConfig, recorder: Recorder | None) -> StartDecision:
    """Rank 0's plan; a refusal travels to every rank (raising here alone would leave the others waiting)."""
    try:
        return _plan(config, recorder)
    except RunBroken as exc:
        return StartDecision(stopped=str(exc))
    except StorageUnavailable as exc:
        return StartDecision(stopped=str(_stopped(exc)))
    except (IllegalTransition, RunUnknown, Fenced, StorageError) as exc:
        return StartDecision(refused=str(exc))


def _plan(config: CheckpointConfig, recorder: Recorder | None) -> StartDecision:
    """Rank 0: the lifecycle's plan, from the log when it answers, else from the directory alone; the
    directories it sets aside are moved here (kept, never deleted), and the directory is claimed for the
    attempt (an older attempt that wakes up then writes nothing more)."""
    state = _run_state(config, recorder)
    if config.object_dir is not None:
        return _plan_object(config, recorder, state)
    if state is not None and is_object_storage(state.launch.storage):
        return StartDecision(
            refused=f"run {state.run_id} was launched on {state.launch.storage}, not a file system "
            f"(the trainer was given {config.ckpt_dir})"
        )
    run = config.ckpt_dir if state is None else run_dir(uri_path(state.launch.storage), state.run_id)
    if run.resolve() != config.ckpt_dir.resolve():  # its checkpoints would all be outside the run's
        return StartDecision(
            refused=f"checkpoint directory {config.ckpt_dir} is not run {config.run_id}'s directory {run} "
            "(under the storage root it was launched with)"
        )
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    in_place = state is not None and state.status == "running" and restarts > 0 and config.resume
    plan = plan_resume(
        state, on_disk(config.ckpt_dir), forced=True, fresh=not config.resume, failed_in_place=in_place
    )
    opened = settings.attempt()
    if state is None and config.run_id and config.resume and opened != 1:
        # No log to ask and no checkpoint found: a first start, or storage that is not mounted right now.
        # Only a first attempt may start from nothing; any other stops until the run directory is back.
        require_listable(config.ckpt_dir)
    if in_place and recorder is not None:
        assert state is not None
        recorder.record(
            FailIntent(
                reason="exit-code",
                message=f"torchrun restarted the workers (TORCHELASTIC_RESTART_COUNT={restarts})",
                attempt=opened or state.attempt,
            )
        )
    attempt = opened or (_attempt(state, plan, config.ckpt_dir) if config.run_id else 0)
    if attempt:
        if plan.candidates:  # the log expects checkpoints there: claiming must not recreate a missing root
            require_listable(config.ckpt_dir)
        claim(config.ckpt_dir, attempt)
    set_aside_planned(plan)
    return StartDecision(plan, attempt, run_dir=str(run))


def _plan_object(
    config: CheckpointConfig, recorder: Recorder | None, state: RunState | None
) -> StartDecision:
    """Rank 0 on object storage: the same plan, from the log or the bucket's sealed steps; what it sets aside
    is copied out of the step names (kept), once the run is claimed for the attempt (`s3_fence`, as on a file
    system)."""
    assert config.object_dir is not None
    location = config.object_dir.rstrip("/")
    if state is not None and f"{state.launch.storage.rstrip('/')}/{state.run_id}" != location:
        return StartDecision(
            refused=f"checkpoint location {location} is not run {state.run_id}'s "
            f"({state.launch.storage.rstrip('/')}/{state.run_id}, under the storage root it was launched with)"
        )
    storage, run_name = run_storage(location)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    in_place = state is not None and state.status == "running" and restarts > 0 and config.resume
    plan = plan_resume(
        state, storage.complete(run_name), forced=True, fresh=not config.resume, failed_in_place=in_place
    )
    opened = settings.attempt()
    if in_place and recorder is not None:
        assert state is not None
        recorder.record(
            FailIntent(
                reason="exit-code",
                message=f"torchrun restarted the workers (TORCHELASTIC_RESTART_COUNT={restarts})",
                attempt=opened or state.attempt,
            )
        )
    current = state.attempt if state is not None else s3_fence.owner(storage, run_name)  # log out of reach
    attempt = opened or ((current + (1 if plan.candidates or plan.restart else 0)) if config.run_id else 0)
    if attempt:
        s3_fence.claim(storage, run_name, attempt)
    stamp = str(int(time.time()))
    for unrecorded in plan.unrecorded:
        log.warning("unrecorded_checkpoint_set_aside", uri=unrecorded.uri)
        storage.quarantine(unrecorded.uri, "unrecorded", stamp)
    for old in plan.superseded:
        storage.quarantine(old.uri, "superseded", stamp)
    return StartDecision(plan, attempt, run_dir=location)


def _attempt(state: RunState | None, plan: ResumePlan, ckpt_dir: Path) -> int:
    """Outside `ftrain run` (which names the attempt it opened): the attempt the run is in, or the next when
    this start resumes (which opens it). The log says which; when it is out of reach, the directory's last
    claim. A job without a run id has no attempts: the directory is its only truth."""
    current = state.attempt if state is not None else owner(ckpt_dir)
    return current + (1 if plan.candidates or plan.restart else 0)


def set_aside_planned(plan: ResumePlan) -> None:
    """Move what the plan sets aside out of the way (kept as evidence, never deleted): directories the log
    never recorded, and with --no-resume the older checkpoints, so the fresh run owns the step names."""
    stamp = str(int(time.time()))
    for unrecorded in plan.unrecorded:
        log.warning("unrecorded_checkpoint_set_aside", uri=unrecorded.uri)
        set_aside(uri_path(unrecorded.uri), "unrecorded", stamp)
    for old in plan.superseded:
        set_aside(uri_path(old.uri), "superseded", stamp)


def _run_state(config: CheckpointConfig, recorder: Recorder | None) -> RunState | None:
    if config.run_id is None or recorder is None:
        return None
    if not recorder.flush(FLUSH_TIMEOUT):
        log.warning("outbox_not_flushed", run_id=config.run_id)
        return None
    return read_run(config.run_id, settings.nats(os.environ), LOG_TIMEOUT)


def _broadcast(value: T | None, group: dist.ProcessGroup) -> T:
    """Rank 0's `value` on every rank."""
    box: list[T | None] = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    return box[0]
