"""Automatic resume at trainer start-up: every rank agrees on one checkpoint, verified by all of them, on any
backend, through the storage port's run guard (rank 0 readies the location) and step reader (every rank).

Rank 0 plans with the lifecycle's `plan_resume`, the same plan `ftrain resume` executes: the candidates,
newest first, are the checkpoints the log says are valid (after flushing what the previous attempt left in
the outbox), or, with the log out of reach, the steps whose marker and manifest agree. Rank 0 removes the
run's stale partial work, proves the location writable (a probe file written, read back, removed), claims the
run for the attempt (an older attempt that wakes up then seals nothing), sets aside what the plan sets aside,
checks a candidate's marker and manifest and sends it to every rank; each rank then makes the files it owns
readable locally, verified (in place on a file system, downloaded into the node's cache on S3), the verdicts
are combined and DCP loads (`resume_load`), so all ranks fall back together. An invalid checkpoint is
recorded as `corrupt_skipped` and set aside; when checkpoints exist and none is valid, every rank raises
NoValidCheckpoint (never a silent fresh start). Without a log, the steps an earlier start set aside as
corrupt are the evidence that the run had checkpoints: it stays refused until a start with `resume=False`.
"""

import os
import time
import uuid
from typing import TypeVar, cast

import msgspec
import structlog
import torch.distributed as dist

from ftrain import settings
from ftrain.domain.lifecycle import (
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
from ftrain.errors import NoValidCheckpoint as NoValidCheckpoint
from ftrain.errors import ResumeRefused as ResumeRefused
from ftrain.errors import UnknownRun
from ftrain.train.config import CheckpointConfig
from ftrain.train.resume_load import ResumeFailed as ResumeFailed
from ftrain.train.resume_load import ResumeStopped as ResumeStopped
from ftrain.train.resume_load import check_world, load_verified, owned, stopped
from ftrain.train.start_query import RunBroken, read_run
from ftrain.train.state import TrainState
from ftrain.workers.manifest import Manifest
from ftrain.workers.recorder import Recorder
from ftrain.workers.storage.location import under_root
from ftrain.workers.storage.port import RunGuard, RunStorage, StepReader
from ftrain.workers.storage.storage_errors import OUTSIDE_RUN, Fenced, StorageError, StorageUnavailable

LOG_TIMEOUT = 15.0
log = structlog.get_logger(__name__)
T = TypeVar("T")


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
    error: type[ResumeRefused | ResumeStopped] | None = None
    """The kind of the refusal or stop, so that every rank raises the same class (None: the plain one)."""
    start: str = ""
    """Names this start's downloads (object storage), so a crashed start's are never taken for its."""


class Header(msgspec.Struct, frozen=True):
    """Rank 0's reading of a candidate, sent to every rank: its URI once confined to the run's own, and its
    manifest, or why it is refused, or the storage out of reach."""

    uri: str | None
    manifest: Manifest | str | StorageUnavailable


def resume(
    config: CheckpointConfig,
    state: TrainState,
    recorder: Recorder | None,
    group: dist.ProcessGroup,
    store: RunStorage,
) -> tuple[ResumePoint | None, int, ResumePlan]:
    """Load the newest valid checkpoint into `state` on every rank; returns where training continues (None:
    from the start), the attempt this job records in (0: no log to say) and the plan (what retention may
    count: `ResumePlan.accepted`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    decision = _broadcast(_safe_plan(config, recorder, store) if rank == 0 else None, group)
    if decision.refused:
        raise (decision.error or ResumeRefused)(decision.refused)
    if decision.stopped:
        raise (decision.error or ResumeStopped)(decision.stopped)
    plan, attempt = decision.plan, decision.attempt
    for candidate in plan.candidates:
        header = _broadcast(_header(store, candidate, config.run_name) if rank == 0 else None, group)
        if isinstance(header.manifest, StorageUnavailable):
            raise stopped(header.manifest)
        reason = header.manifest if isinstance(header.manifest, str) else None
        if reason is None and header.uri is not None:
            manifest = cast(Manifest, header.manifest)
            check_world(config.world_change, state, manifest, world)
            mine = owned(manifest.files, rank, world)
            with store.readable(header.uri, manifest, mine, start=decision.start, rank=rank) as local:
                reason = load_verified(local, manifest, state, group)
        if reason is None:
            saved_world = cast(Manifest, header.manifest).world_size
            return _resumed(candidate, state, recorder, attempt, saved_world), attempt, plan
        if rank == 0:
            _skip(store, candidate, header.uri, reason, recorder)
    if plan.had_checkpoints:
        raise _no_valid(config, plan)
    if plan.restart:
        _record(recorder, ResumeIntent(checkpoint_hash=None, step=0, attempt=attempt))
    return None, attempt, plan


def _no_valid(config: CheckpointConfig, plan: ResumePlan) -> NoValidCheckpoint:
    """The refusal to start over, saying what to look at and how to start over on purpose."""
    where = config.location.uri
    found = (
        f"{len(plan.candidates)} checkpoint(s) found corrupt now"
        if plan.candidates
        else "every checkpoint was found corrupt by an earlier start"
    )
    if config.run_id:
        then = (
            f"`ftrain status {config.run_id}` lists what the log recorded; to train from step 0 on purpose, "
            "launch a new run id"
        )
    else:
        then = (
            "to train from step 0 on purpose, start once with resume=False (the reference trainer's "
            "--no-resume)"
        )
    return NoValidCheckpoint(
        f"no valid checkpoint in {where}: {found}, set aside there as step-N.corrupt-<time> (kept as "
        f"evidence: inspect them there); refusing to start over. {then}"
    )


def _header(reader: StepReader, candidate: Candidate, run_id: str) -> Header:
    """Rank 0's reading of the candidate's marker and manifest, once its URI is found to name a step of the
    run's own (else nothing is read); storage out of reach is sent, not raised."""
    try:
        uri = reader.confined(candidate.uri)
        if uri is None:
            return Header(None, OUTSIDE_RUN)
        return Header(uri, reader.read_manifest(uri, candidate.digest, run_id=run_id, step=candidate.step))
    except StorageUnavailable as exc:
        return Header(None, exc)
    except StorageError as exc:
        return Header(None, str(exc))


def _resumed(
    candidate: Candidate, state: TrainState, recorder: Recorder | None, attempt: int, saved_world: int
) -> ResumePoint:
    point = ResumePoint(state.step, state.epoch)
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        data = state.data.position.position() if state.data and state.data.position else None
        intent = ResumeIntent(
            checkpoint_hash=candidate.digest or "",
            step=point.step,
            attempt=attempt,
            saved_world=saved_world,
            world=world,
            data=data,
        )
        _record(recorder, intent)
        changed = f", saved by {saved_world} ranks, resumed by {world}" if saved_world != world else ""
        at = f", data at sample {data.offset} of epoch {data.epoch}" if data is not None else ""
        print(f"RESUMED from step={point.step} (epoch={point.epoch}){changed}{at}", flush=True)
    return point


def _skip(
    reader: StepReader, candidate: Candidate, uri: str | None, reason: str, recorder: Recorder | None
) -> None:
    """Record the refusal and set the checkpoint aside; one outside the run's own (`uri` None) is neither
    read nor moved."""
    _record(recorder, SkipIntent(checkpoint_hash=candidate.digest or "", step=candidate.step, reason=reason))
    if uri is not None:
        try:
            reader.quarantine(uri, "corrupt", f"{int(time.time())}")
        except (StorageUnavailable, StorageError, OSError) as exc:
            log.warning("set_aside_failed", uri=uri, error=str(exc))
    print(skipped_line(candidate.step, reason), flush=True)


def _safe_plan(config: CheckpointConfig, recorder: Recorder | None, store: RunStorage) -> StartDecision:
    """Rank 0's plan; a refusal travels to every rank (raising here alone would leave the others waiting)."""
    try:
        return _plan(config, recorder, store)
    except RunBroken as exc:
        return StartDecision(stopped=str(exc))
    except StorageUnavailable as exc:
        stop = stopped(exc)
        return StartDecision(stopped=str(stop), error=type(stop))
    except OSError as exc:  # the storage refused a claim, a clean-up or a move: as out of reach
        return StartDecision(stopped=str(stopped(StorageUnavailable(f"storage unavailable: {exc}"))))
    except UnknownRun as exc:
        return StartDecision(
            refused=f"{exc} in the event log: check the run id (`ftrain list`) and FTRAIN_NATS_URL, or leave "
            "run_id out to checkpoint without a log",
            error=UnknownRun,
        )
    except (IllegalTransition, Fenced, StorageError) as exc:
        return StartDecision(refused=str(exc))


def _plan(config: CheckpointConfig, recorder: Recorder | None, store: RunStorage) -> StartDecision:
    """Rank 0: the lifecycle's plan, from the log when it answers, else from the run's sealed steps (and the
    ones set aside as corrupt) alone; the run's stale partial work is removed, its location proven writable,
    the run claimed for the attempt, and what the plan sets aside moved (kept, never deleted).

    Cleaning before claiming (`_prepare`) takes nothing from a live older attempt that claiming first
    protected: under `ftrain run` the supervisor claimed the fence when it opened this attempt; elsewhere an
    older attempt still writing could equally seal in the moment between listing and claiming, and what it
    seals then is never recorded (the log has moved on) and set aside at the next seal of that step."""
    state = _run_state(config, recorder)
    if state is not None and not (launched := under_root(state.launch.storage, state.run_id)).same(
        config.location
    ):
        return StartDecision(
            refused=f"checkpoint location {config.location.uri} is not run {state.run_id}'s "
            f"({launched.uri}, under the storage root it was launched with)"
        )
    restarts = in_place_restarts(state, config)
    plan = plan_resume(
        state,
        store.complete(),
        forced=True,
        fresh=not config.resume,
        failed_in_place=bool(restarts),
        quarantined=store.quarantined() if state is None else (),
    )
    opened = settings.attempt()
    if state is None and config.run_id and config.resume and opened != 1:
        # No log to ask and no checkpoint found: a first start, or storage that is not mounted right now.
        # Only a first attempt may start from nothing; any other stops until the run's location is back.
        store.reachable()
    record_in_place(recorder, state, restarts, opened)
    attempt = opened or (_attempt(state, plan, store) if config.run_id else 0)
    if plan.candidates or not plan.had_checkpoints:
        # else nothing is left to try: the start is refused (NoValidCheckpoint) and prepares nothing, so each
        # later start is refused the same way, never as superseded by this one's claim
        _prepare(store, plan, attempt)
    set_aside_planned(store, plan)
    return StartDecision(plan, attempt, start=uuid.uuid4().hex[:12])


def _prepare(guard: RunGuard, plan: ResumePlan, attempt: int) -> None:
    """Rank 0, before the first step: the stale partial work removed before anything is written (on a full
    disk, the dead attempt's partial step is what frees the space), the location proven writable, the run
    claimed for `attempt` (0: a job without a run id claims nothing). A superseded start stops at the fence,
    before it removes anything of the newer attempt's."""
    if plan.candidates:  # checkpoints are expected there: the probe must not recreate a missing root
        guard.reachable()
    if attempt:
        guard.check(attempt)
    guard.clean()
    guard.probe()
    if attempt:
        guard.claim(attempt)


def _attempt(state: RunState | None, plan: ResumePlan, guard: RunGuard) -> int:
    """Outside `ftrain run` (which names the attempt it opened): the attempt the run is in, or the next when
    this start resumes (which opens it). The log says which; when it is out of reach, the fence's last
    claim. A job without a run id has no attempts: the location is its only truth."""
    current = state.attempt if state is not None else guard.owner()
    return current + (1 if plan.candidates or plan.restart else 0)


def set_aside_planned(reader: StepReader, plan: ResumePlan) -> None:
    """Move what the plan sets aside out of the way (kept as evidence, never deleted): steps the log never
    recorded, and with --no-resume the older checkpoints, so the fresh run owns the step names."""
    stamp = str(int(time.time()))
    for unrecorded in plan.unrecorded:
        log.warning("unrecorded_checkpoint_set_aside", uri=unrecorded.uri)
        reader.quarantine(unrecorded.uri, "unrecorded", stamp)
    for old in plan.superseded:
        reader.quarantine(old.uri, "superseded", stamp)


def in_place_restarts(state: RunState | None, config: CheckpointConfig) -> int:
    """How many times torchrun restarted this running run's workers in place (0: none, or nothing to record)."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    running = state is not None and state.status == "running"
    return restarts if running and restarts > 0 and config.resume else 0


def record_in_place(
    recorder: Recorder | None, state: RunState | None, restarts: int, opened: int | None
) -> None:
    """Record the failure torchrun restarted the workers for (the log never heard of it otherwise)."""
    if restarts and state is not None:
        _record(
            recorder,
            FailIntent(
                reason="exit-code",
                message=f"torchrun restarted the workers (TORCHELASTIC_RESTART_COUNT={restarts})",
                attempt=opened or state.attempt,
            ),
        )


def _record(recorder: Recorder | None, intent: ResumeIntent | SkipIntent | FailIntent) -> None:
    """Rank 0: hand `intent` to the outbox (a job without a run id records nothing)."""
    if recorder is not None:
        recorder.record(intent)


def _run_state(config: CheckpointConfig, recorder: Recorder | None) -> RunState | None:
    if config.run_id is None or recorder is None:
        return None
    return read_run(config.run_id, settings.nats(os.environ), LOG_TIMEOUT, recorder)


def _broadcast(value: T | None, group: dist.ProcessGroup) -> T:
    """Rank 0's `value` on every rank."""
    box: list[T | None] = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    return box[0]
