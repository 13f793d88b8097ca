"""Automatic resume at trainer start-up: every rank agrees on one checkpoint, verified by all of them.

Rank 0 plans with the lifecycle's `plan_resume`, the same plan `ftrain resume` executes: the candidates,
newest first, are the checkpoints the log says are valid (after flushing what the previous attempt left in
the outbox), or, with the log out of reach, the directories whose marker and manifest agree (on object
storage, the sealed steps: `object_resume`). Rank 0 checks a candidate's marker and manifest and sends it to
every rank; each rank then checks the files it owns and the verdicts are combined (`resume_load`), so all
ranks fall back together. An invalid checkpoint is recorded as `corrupt_skipped` and set aside; when
checkpoints exist and none is valid, every rank raises NoValidCheckpoint (never a silent fresh start).
"""

import os
import time
import uuid
from pathlib import Path
from typing import TypeVar, cast

import msgspec
import structlog
import torch.distributed as dist

from ftrain import settings
from ftrain.projections.lifecycle import (
    Candidate,
    IllegalTransition,
    ResumeIntent,
    ResumePlan,
    RunState,
    SkipIntent,
    plan_resume,
    skipped_line,
)
from ftrain.train.config import CheckpointConfig
from ftrain.train.object_resume import header_object, load_object, plan_object, skip_object
from ftrain.train.object_store import cache_name, run_storage
from ftrain.train.resume_load import ResumeFailed as ResumeFailed
from ftrain.train.resume_load import ResumeStopped as ResumeStopped
from ftrain.train.resume_load import in_place_restarts, load_verified, local_verdict, record_in_place, stopped
from ftrain.train.run_log import RunBroken, RunUnknown, read_run
from ftrain.train.state import TrainState
from ftrain.workers.checkpoint_dir import (
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
)
from ftrain.workers.fence import Fenced, claim, owner
from ftrain.workers.layout import assemblies, run_dir
from ftrain.workers.manifest import Manifest
from ftrain.workers.nofollow import remove_dir
from ftrain.workers.recorder import Recorder
from ftrain.workers.storage.open import is_object_storage
from ftrain.workers.storage.s3_store import S3Storage

FLUSH_TIMEOUT = 15.0
LOG_TIMEOUT = 15.0
log = structlog.get_logger(__name__)
T = TypeVar("T")


class NoValidCheckpoint(RuntimeError):
    """Checkpoints exist and none of them verified: the job must stop, not start over."""


class ResumeRefused(RuntimeError):
    """The start-up request contradicts the log (e.g. --no-resume on a run that has checkpoints)."""


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
    start: str = ""
    """Names this start's download caches on object storage, so a crashed start's are never taken for its."""


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
    located = run_storage(config.object_dir) if config.object_dir else None
    decision = _broadcast(_safe_plan(config, recorder, located) if rank == 0 else None, group)
    if decision.refused:
        raise ResumeRefused(decision.refused)
    if decision.stopped:
        raise ResumeStopped(decision.stopped)
    plan, attempt, run = decision.plan, decision.attempt, Path(decision.run_dir)
    objects = located[0] if located is not None else None
    for candidate in plan.candidates:
        header = cast(
            Manifest | str | StorageUnavailable,
            _broadcast(
                (
                    header_object(objects, candidate, _run_id(config))
                    if objects
                    else _header(run, candidate, _run_id(config))
                )
                if rank == 0
                else None,
                group,
            ),
        )
        if isinstance(header, StorageUnavailable):
            raise stopped(header)
        if objects is not None:
            cache = cache_name(decision.start, candidate.step)
            reason = (
                header
                if isinstance(header, str)
                else load_object(objects, candidate.uri, header, state, config.ckpt_dir, cache, group)
            )
            if reason is None:
                return _resumed(None, candidate, state, recorder, attempt), attempt
            if rank == 0:
                skip_object(objects, candidate, reason, recorder)
            continue
        path = run / uri_path(candidate.uri).name  # rank 0 found the URI names this directory
        reason = (
            header
            if isinstance(header, str)
            else load_verified(path, header, state, group, local_verdict(path, header))
        )
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


def _safe_plan(
    config: CheckpointConfig, recorder: Recorder | None, located: tuple[S3Storage, str] | None
) -> StartDecision:
    """Rank 0's plan; a refusal travels to every rank (raising here alone would leave the others waiting)."""
    try:
        return _plan(config, recorder, located)
    except RunBroken as exc:
        return StartDecision(stopped=str(exc))
    except StorageUnavailable as exc:
        return StartDecision(stopped=str(stopped(exc)))
    except (IllegalTransition, RunUnknown, Fenced, StorageError) as exc:
        return StartDecision(refused=str(exc))


def _plan(
    config: CheckpointConfig, recorder: Recorder | None, located: tuple[S3Storage, str] | None
) -> StartDecision:
    """Rank 0: the lifecycle's plan, from the log when it answers, else from the directory (or, on object
    storage `located`, the bucket) alone; the directories it sets aside are moved here (kept, never
    deleted), and the directory is claimed for the attempt (an older attempt that wakes up then writes
    nothing more)."""
    state = _run_state(config, recorder)
    if config.object_dir is not None and located is not None:
        planned = plan_object(config, recorder, state, *located)
        if isinstance(planned, str):
            return StartDecision(refused=planned)
        return StartDecision(*planned, run_dir=config.object_dir.rstrip("/"), start=uuid.uuid4().hex[:12])
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
    restarts = in_place_restarts(state, config)
    plan = plan_resume(
        state, on_disk(config.ckpt_dir), forced=True, fresh=not config.resume, failed_in_place=bool(restarts)
    )
    opened = settings.attempt()
    if state is None and config.run_id and config.resume and opened != 1:
        # No log to ask and no checkpoint found: a first start, or storage that is not mounted right now.
        # Only a first attempt may start from nothing; any other stops until the run directory is back.
        require_listable(config.ckpt_dir)
    record_in_place(recorder, state, restarts, opened)
    attempt = opened or (_attempt(state, plan, config.ckpt_dir) if config.run_id else 0)
    if attempt:
        if plan.candidates:  # the log expects checkpoints there: claiming must not recreate a missing root
            require_listable(config.ckpt_dir)
        claim(config.ckpt_dir, attempt)
    set_aside_planned(plan)
    return StartDecision(plan, attempt, run_dir=str(run))


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
