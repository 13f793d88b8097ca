"""Automatic resume at trainer start-up: every rank agrees on one checkpoint, verified by all of them, on any
backend, through the storage port's run guard (rank 0 readies the location) and step reader (every rank).

First every rank readies its node-local stage directory (`RunGuard.prepare`); rank 0 gathers their verdicts
before it plans, so a directory refused on any rank refuses the start on every rank, as any other refusal
of rank 0's decision does, before the log is read or the storage touched.

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

What rank 0 asks of the log (`read_run`) is its own run's state, folded from its own events only, so it costs
the same whatever else the stream holds. Training must never stall on the log: the query is bounded, and an
unreachable log sends the trainer to the checkpoint directory itself.
"""

import asyncio
import os
import time
import uuid
from typing import TypeVar

import msgspec
import structlog
import torch.distributed as dist
from nats.errors import Error as NatsError

from ftrain import settings
from ftrain.domain.command_handler import BrokenRun, RunLog
from ftrain.domain.lifecycle import (
    IllegalTransition,
    ResumeIntent,
    ResumePlan,
    RunState,
    SkipIntent,
    no_valid_refusal,
    plan_resume,
    restarted_in_place,
    resumed_line,
    skipped_line,
)
from ftrain.errors import FtrainError, UnknownRun
from ftrain.errors import NoValidCheckpoint as NoValidCheckpoint
from ftrain.errors import ResumeRefused as ResumeRefused
from ftrain.events.jetstream.connection import NatsSettings, open_store
from ftrain.events.jetstream.nats_server import NatsServerError
from ftrain.events.keyring import KeyringError
from ftrain.events.log_port import LogTampered, LogUnavailable
from ftrain.train.config import CheckpointConfig
from ftrain.train.resume_load import ResumeFailed as ResumeFailed
from ftrain.train.resume_load import ResumeStopped as ResumeStopped
from ftrain.train.resume_load import load_candidate, stopped
from ftrain.train.state import TrainState
from ftrain.workers.manifest import Manifest
from ftrain.workers.recorder import Recording
from ftrain.workers.stage_dir import UnsafeDirectory
from ftrain.workers.storage.location import under_root
from ftrain.workers.storage.port import RunStorage, read_header, ready, set_aside_planned
from ftrain.workers.storage.storage_errors import Fenced, StorageError, StorageUnavailable

LOG_TIMEOUT = 15.0
FLUSH_TIMEOUT = 15.0
log = structlog.get_logger(__name__)
T = TypeVar("T")


class RunBroken(FtrainError):
    """The run's chain is broken: its state cannot be trusted, so nothing is resumed, set aside or recorded."""


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
    error: type[ResumeRefused | ResumeStopped | UnsafeDirectory] | None = None
    """The kind of the refusal or stop, so that every rank raises the same class (None: the plain one)."""
    start: str = ""
    """Names this start's downloads (object storage), so a crashed start's are never taken for its."""


def resume(
    config: CheckpointConfig,
    state: TrainState,
    recorder: Recording | None,
    group: dist.ProcessGroup,
    store: RunStorage,
) -> tuple[ResumePoint | None, int, ResumePlan]:
    """Ready every rank's stage directory, then load the newest valid checkpoint into `state` on every rank;
    returns where training continues (None: from the start), the attempt this job records in (0: no log to
    say) and the plan (what retention may count: `ResumePlan.accepted`). A stage directory refused on any
    rank is refused on every rank, before rank 0 plans: that rank raises its UnsafeDirectory, the others the
    lowest refusing rank's."""
    rank = dist.get_rank()
    unsafe = _ready_stage(store, rank, staged=config.async_save)
    stages = _gathered(None if unsafe is None else str(unsafe), group)
    decision = _broadcast(_safe_plan(config, recorder, store, stages) if stages is not None else None, group)
    if unsafe is not None:
        raise unsafe
    if decision.refused:
        raise (decision.error or ResumeRefused)(decision.refused)
    if decision.stopped:
        raise (decision.error or ResumeStopped)(decision.stopped)
    plan, attempt = decision.plan, decision.attempt
    for candidate in plan.candidates:
        header = read_header(store, candidate, config.run_name) if rank == 0 else None
        try:
            loaded = load_candidate(header, store, state, config.world_change, decision.start, group)
        except StorageUnavailable as exc:  # alike on every rank: rank 0's reading, or every rank's verdicts
            raise stopped(exc) from exc
        if isinstance(loaded, Manifest):
            point = ResumePoint(state.step, state.epoch)
            if rank == 0:
                resumed = ResumeIntent(
                    checkpoint_hash=candidate.digest or "",
                    step=point.step,
                    attempt=attempt,
                    saved_world=loaded.world_size,
                    world=dist.get_world_size(),
                    data=state.data.position.position() if state.data and state.data.position else None,
                )
                if recorder is not None:
                    recorder.record(resumed)
                print(resumed_line(resumed, point.epoch), flush=True)
            return point, attempt, plan
        if header is not None:  # rank 0: the refusal recorded, the checkpoint set aside (kept as evidence)
            if recorder is not None:
                recorder.record(
                    SkipIntent(checkpoint_hash=candidate.digest or "", step=candidate.step, reason=loaded)
                )
            if header.uri is not None:  # one outside the run's own is neither read nor moved
                try:
                    store.quarantine(header.uri, "corrupt", f"{int(time.time())}")
                except (StorageUnavailable, StorageError, OSError) as exc:
                    log.warning("set_aside_failed", uri=header.uri, error=str(exc))
            print(skipped_line(candidate.step, loaded), flush=True)
    if plan.had_checkpoints:
        raise NoValidCheckpoint(no_valid_refusal(config.location.uri, len(plan.candidates), config.run_id))
    if plan.restart and recorder is not None:
        recorder.record(ResumeIntent(checkpoint_hash=None, step=0, attempt=attempt))
    return None, attempt, plan


def _ready_stage(store: RunStorage, rank: int, *, staged: bool) -> UnsafeDirectory | None:
    """This rank's stage directory readied (`RunGuard.prepare`), or why it is refused: it is the node's own,
    so perhaps only some ranks see it refused."""
    try:
        store.prepare(rank, staged=staged)
    except UnsafeDirectory as exc:
        return exc
    return None


def _safe_plan(
    config: CheckpointConfig, recorder: Recording | None, store: RunStorage, stages: list[str | None]
) -> StartDecision:
    """Rank 0's plan, once every rank's stage directory is ready (`stages`: each rank's refusal, None when
    ready); a refusal travels to every rank (raising here alone would leave the others waiting)."""
    unready = next(((peer, words) for peer, words in enumerate(stages) if words is not None), None)
    if unready is not None:
        return StartDecision(refused=f"rank {unready[0]}: {unready[1]}", error=UnsafeDirectory)
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


def _plan(config: CheckpointConfig, recorder: Recording | None, store: RunStorage) -> StartDecision:
    """Rank 0: the lifecycle's plan, from the log when it answers, else from the run's sealed steps (and the
    ones set aside as corrupt) alone; the run's stale partial work is removed, its location proven writable,
    the run claimed for the attempt, and what the plan sets aside moved (kept, never deleted).

    Cleaning before claiming (`ready`) takes nothing from a live older attempt that claiming first
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
    opened = settings.attempt()
    in_place = restarted_in_place(state, settings.torchrun_restarts() if config.resume else 0, opened)
    plan = plan_resume(
        state,
        store.complete(),
        forced=True,
        fresh=not config.resume,
        failed_in_place=in_place is not None,
        quarantined=store.quarantined() if state is None else (),
    )
    if state is None and config.run_id and config.resume and opened != 1:
        # No log to ask and no checkpoint found: a first start, or storage that is not mounted right now.
        # Only a first attempt may start from nothing; any other stops until the run's location is back.
        store.reachable()
    # Outside `ftrain run` (which names the attempt it opened) the log says which attempt the run is in, or,
    # out of reach, the fence's last claim; a job without a run id has no attempts
    attempt = opened or (
        plan.attempt_after(state.attempt if state else store.owner()) if config.run_id else 0
    )
    if in_place is not None and recorder is not None:
        recorder.record(in_place)
    if plan.candidates or not plan.had_checkpoints:
        # else nothing is left to try: the start is refused (NoValidCheckpoint) and prepares nothing, so each
        # later start is refused the same way, never as superseded by this one's claim
        ready(store, attempt, expected=bool(plan.candidates))
    set_aside_planned(store, plan)
    return StartDecision(plan, attempt, start=uuid.uuid4().hex[:12])


def _run_state(config: CheckpointConfig, recorder: Recording | None) -> RunState | None:
    if config.run_id is None or recorder is None:
        return None
    return read_run(config.run_id, settings.nats(os.environ), LOG_TIMEOUT, recorder)


def read_run(
    run_id: str, settings: NatsSettings, timeout: float, recorder: Recording | None = None
) -> RunState | None:
    """The state of `run_id` from its own events; None if the log cannot be read within `timeout` seconds,
    or when `recorder` (the trainer's) cannot append what its outbox still holds for the run (what
    the previous attempt left) within FLUSH_TIMEOUT. Raises UnknownRun when the log is readable but knows no
    such run, RunBroken when its chain is broken."""
    if recorder is not None and not recorder.flush(FLUSH_TIMEOUT):
        log.warning("outbox_not_flushed", run_id=run_id)
        return None

    async def query() -> RunState | None:
        async with open_store(settings) as store:
            await store.ensure_stream()
            return await RunLog(store, run_id).state()

    try:
        state = asyncio.run(asyncio.wait_for(query(), timeout))
    except (BrokenRun, LogTampered, KeyringError) as exc:
        raise RunBroken(f"{exc}; refusing to resume") from exc
    except (LogUnavailable, NatsServerError, NatsError, OSError, TimeoutError) as exc:
        log.warning("log_unreachable", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        return None
    if state is None:
        raise UnknownRun(f"unknown run {run_id!r}")
    return state


def _gathered(value: T, group: dist.ProcessGroup) -> list[T] | None:
    """Every rank's `value`, in rank order, on rank 0 (None on the others)."""
    every: list[T] | None = [value] * dist.get_world_size(group) if dist.get_rank() == 0 else None
    dist.gather_object(value, every, dst=0, group=group)
    return every


def _broadcast(value: T | None, group: dist.ProcessGroup) -> T:
    """Rank 0's `value` on every rank."""
    box: list[T | None] = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    return box[0]
