"""Deciders: the event a writer's request becomes against the run's current state. Pure, no I/O.

A decider either builds the event (which the judge then checks, so a stale decision is refused, never
redirected), says the state already reflects the request (None), or raises IllegalTransition itself when
the request makes no sense before any event is built (a relaunch of a completed run).
"""

from datetime import datetime

import msgspec
from msgspec import UNSET

from ftrain.domain.lifecycle.intents import (
    CheckpointIntent,
    FailIntent,
    Intent,
    ReplicaIntent,
    ResumeIntent,
    SkipIntent,
    SnapshotIntent,
)
from ftrain.domain.lifecycle.judge import IllegalTransition, check_open
from ftrain.domain.lifecycle.run_state import CheckpointRef, RunState
from ftrain.events.schema import (
    SNAPSHOT_TIERS,
    AnyEvent,
    Checkpointed,
    CheckpointPolicy,
    Completed,
    CorruptSkipped,
    Failed,
    Resumed,
    SnapshotReplicated,
)


def check_relaunch(
    state: RunState,
    *,
    user: str,
    project: str,
    gpus_per_node: int,
    strategy: str,
    dataset_revision: str | None,
    checkpoint_policy: CheckpointPolicy | None,
) -> None:
    """Only a failed run is relaunched (a running one may still have its supervisor), only by the user who
    launched it, and only as itself: the same processes per node and strategy, and the same data and
    checkpoint cadence, which shape what it trains (its supervisor runs the launch's, so a different one would
    be dropped without a word). The number of nodes may change: the attempt's `resumed` names its nodes, and
    the trainer resumes resharded, on the same global batch when its loader keeps a global position."""
    check_owner(state, user)
    _check_failed(state)
    launch = state.launch
    if (launch.project, launch.gpus_per_node, launch.strategy) != (project, gpus_per_node, strategy):
        raise IllegalTransition(
            f"run {state.run_id} was launched as {launch.project} {launch.nodes}×{launch.gpus_per_node} "
            f"{launch.strategy}; relaunch it with the same project, --gpus-per-node and --strategy (--nodes may "
            "change)"
        )
    if launch.dataset_revision != dataset_revision:
        raise IllegalTransition(
            f"run {state.run_id} was launched with --dataset-revision {_given(launch.dataset_revision)}, not "
            f"{_given(dataset_revision)}: relaunch it with the same, or pass a new --run-id for a new run"
        )
    was, now = (p.text if p is not None else None for p in (launch.checkpoint_policy, checkpoint_policy))
    if was != now:
        raise IllegalTransition(
            f"run {state.run_id} was launched with --checkpoint-every {_given(was)}, not {_given(now)}: "
            "relaunch it with the same, or pass a new --run-id for a new run"
        )


def check_owner(state: RunState, user: str) -> None:
    """A run is relaunched or taken over only by the user whose `launched` opened it: on a log users share,
    another user's job that names the same run id (its own --run-id, or a recycled job id) is refused."""
    actor = state.launch.actor
    if actor is not None and actor.user != user:
        raise IllegalTransition(
            f"run {state.run_id} was launched by {actor.user}@{actor.host}, not by {user}: "
            "pass a --run-id of your own"
        )


def _given(value: str | None) -> str:
    return repr(value) if value is not None else "(none)"


def _check_failed(state: RunState) -> None:
    check_open(state)
    if state.status == "running":
        raise IllegalTransition(
            f"run {state.run_id} is running (another supervisor?); if it is dead, record that first: "
            f"ftrain fail {state.run_id}"
        )


def supervisor_lost(state: RunState, holder: str | None) -> Failed | None:
    """The `failed` (reason `lost`) a relaunch records, holding the run's lease, for a running run whose
    supervisor (`holder`, as its lease named it) stopped renewing that lease; None when the run is no longer
    running. A run no supervisor ever leased (`holder` None: `ftrain launch`, or an older ftrain's) keeps
    the refusal: nothing says its supervisor is gone."""
    if holder is None:
        _check_failed(state)
    check_open(state)
    if state.status != "running":
        return None
    return Failed(
        run_id=state.run_id,
        reason="lost",
        message=f"its supervisor {holder} stopped renewing its lease",
        attempt=state.attempt,
    )


def relaunch(state: RunState, hosts: tuple[str, ...] = ()) -> Resumed:
    """The `resumed` a supervisor appends before it starts any process of a relaunch: it opens the next attempt
    (of two racing supervisors, the one whose append lands; the other then finds the run running), from the
    newest checkpoint the log says is valid (the trainer verifies it, and records a fallback within the
    attempt), or from step 0 for a run that never checkpointed; on `hosts` (empty: the launch's nodes). It
    says the world before (the checkpoint's shards) and after (the attempt's nodes × processes per node) and
    the data position resumed from, since the trainer's own `resumed` folds into the attempt it opens."""
    _check_failed(state)
    newest = next(iter(state.valid_checkpoints()), None)
    if newest is None:
        return msgspec.structs.replace(restart_event(state, forced=False), hosts=hosts or UNSET)
    saved = newest.recorded
    return msgspec.structs.replace(
        resumed_event(state, newest, forced=False),
        hosts=hosts or UNSET,
        saved_world=saved.shards,
        world=(len(hosts) or state.launch.nodes) * state.launch.gpus_per_node,
        data=saved.data,
    )


def resumed_event(state: RunState, ref: CheckpointRef, *, forced: bool, attempt: int = 0) -> Resumed:
    """The `resumed` event for resuming `state` from checkpoint `ref`, relaunching the launch command, in
    `attempt` (0: opening the next one)."""
    return Resumed(
        run_id=state.run_id,
        checkpoint_seq=ref.seq,
        step=ref.step,
        epoch=ref.epoch,
        uri=ref.uri,
        checkpoint_hash=ref.checkpoint_hash,
        resume_count=state.resume_count + 1,
        forced=forced,
        command=state.launch.command,
        attempt=attempt or state.attempt + 1,
    )


def restart_event(state: RunState, *, forced: bool, attempt: int = 0) -> Resumed:
    """The `resumed` event restarting from step 0 a run that never checkpointed (preempted before its first)."""
    return Resumed(
        run_id=state.run_id,
        checkpoint_seq=0,
        step=0,
        epoch=0,
        uri="",
        checkpoint_hash="",
        resume_count=state.resume_count + 1,
        forced=forced,
        command=state.launch.command,
        attempt=attempt or state.attempt + 1,
    )


def corrupt_skipped_event(state: RunState, ref: CheckpointRef, reason: str) -> CorruptSkipped:
    """The `corrupt_skipped` event refusing checkpoint `ref` for `reason`."""
    return CorruptSkipped(
        run_id=state.run_id, checkpoint_seq=ref.seq, step=ref.step, uri=ref.uri, reason=reason
    )


def completed_event(
    state: RunState, cost_gpu_hours: float | None, at: datetime, attempt: int | None = None
) -> Completed:
    """`completed` as of `at`: the reported cost, else running wall time × GPUs (a CPU job: its CPUs or nodes,
    in its `cost_unit`); recorded by `attempt`
    (None: the current one, as an operator's command does)."""
    return Completed(
        run_id=state.run_id,
        cost_gpu_hours=cost_gpu_hours if cost_gpu_hours is not None else state.cost_hours_at(at),
        running_seconds=state.running_seconds_at(at),
        cost_source="reported" if cost_gpu_hours is not None else "wall-time",
        attempt=state.attempt if attempt is None else attempt,
    )


def resume_from(state: RunState, ref: CheckpointRef, *, forced: bool) -> Resumed | None:
    """Resume from `ref` unless another writer changed which checkpoint is newest meanwhile (None: decide
    again). `forced` matters only while the log still says running."""
    newest = next(iter(state.valid_checkpoints()), None)
    if newest is None or newest.seq != ref.seq:
        return None
    return resumed_event(state, ref, forced=forced and state.status == "running")


def skip(state: RunState, ref: CheckpointRef, reason: str) -> CorruptSkipped | None:
    """Refuse checkpoint `ref`, unless another writer already did (None)."""
    current = state.checkpoint(ref.seq)
    if current is None or current.status != "valid":
        return None
    return corrupt_skipped_event(state, ref, reason)


def decide_intent(state: RunState, intent: Intent, intent_id: str, at: datetime) -> AnyEvent | None:
    """The event that records `intent` against the run's current state, or None when the state already
    reflects it (an intent retried after its event landed). Stamped with the intent's id and time, so a
    retried append is deduplicated and the log says when it happened, not when the log was reachable.

    Never judges legality: an intent that cannot apply still becomes its event, for the judge to refuse."""
    event = _intent_event(state, intent, at)
    return None if event is None else msgspec.structs.replace(event, id=intent_id, time=at)


def _intent_event(state: RunState, intent: Intent, at: datetime) -> AnyEvent | None:
    running = state.status == "running"
    if isinstance(intent, CheckpointIntent):
        if _by_hash(state, intent.checkpointed.checkpoint_hash) is not None:
            return None
        return msgspec.structs.replace(intent.checkpointed, run_id=state.run_id)
    if isinstance(intent, SnapshotIntent):
        known = state.snapshot
        if known is not None and known.recorded.checkpoint_hash == intent.snapshotted.checkpoint_hash:
            return None
        return msgspec.structs.replace(intent.snapshotted, run_id=state.run_id)
    if isinstance(intent, ReplicaIntent):
        return _replicated(state, intent)
    if isinstance(intent, SkipIntent) and intent.tier in SNAPSHOT_TIERS:
        return _memory_skip(state, intent)
    if isinstance(intent, ResumeIntent) and intent.tier in SNAPSHOT_TIERS:
        return _memory_resume(state, intent, forced=running)
    if isinstance(intent, SkipIntent):
        ref = _by_hash(state, intent.checkpoint_hash) or _unknown(intent.checkpoint_hash, intent.step, at)
        return None if ref.status != "valid" else corrupt_skipped_event(state, ref, intent.reason)
    if isinstance(intent, ResumeIntent):
        if _opened_by_supervisor(state, intent):
            return None
        if intent.checkpoint_hash is None:
            return restart_event(state, forced=running, attempt=intent.attempt)
        # built for the named checkpoint even when it is not the newest valid one: the judge refuses it then,
        # rather than the run silently resuming from a checkpoint the trainer did not load
        ref = _by_hash(state, intent.checkpoint_hash) or _unknown(intent.checkpoint_hash, intent.step, at)
        return msgspec.structs.replace(
            resumed_event(state, ref, forced=running, attempt=intent.attempt),
            saved_world=intent.saved_world or UNSET,
            world=intent.world or UNSET,
            data=intent.data or UNSET,
        )
    if isinstance(intent, FailIntent):
        if not running:  # a failure of a stopped run is no transition
            return None
        return Failed(
            run_id=state.run_id,
            reason=intent.reason,
            exit_code=intent.exit_code,
            message=intent.message,
            attempt=intent.attempt,
        )
    if state.status == "completed":
        return None
    return completed_event(state, intent.cost_gpu_hours, at, intent.attempt)


def _replicated(state: RunState, intent: ReplicaIntent) -> SnapshotReplicated | None:
    """`snapshot_replicated` of the run's memory snapshot with the intent's digest (None: recorded already);
    one the log does not hold as its newest snapshot names seq 0, for the judge to refuse."""
    wanted, snap = intent.snapshot_replicated, state.snapshot
    known = snap is not None and snap.recorded.checkpoint_hash == wanted.checkpoint_hash
    if snap is not None and known and snap.replicas is not None:
        return None
    seq = snap.recorded.seq if snap is not None and known else 0
    return msgspec.structs.replace(wanted, run_id=state.run_id, snapshot_seq=seq)


def _memory_skip(state: RunState, intent: SkipIntent) -> CorruptSkipped | None:
    """`corrupt_skipped` of the run's memory snapshot with the intent's digest (None: refused already); one
    the log does not hold as its snapshot becomes an event naming seq 0, for the judge to refuse."""
    snap = state.snapshot
    if snap is not None and snap.recorded.checkpoint_hash == intent.checkpoint_hash:
        if snap.status != "valid":
            return None
        seq, uri = snap.recorded.seq, snap.recorded.uri
    else:
        seq, uri = 0, ""
    return CorruptSkipped(
        run_id=state.run_id,
        checkpoint_seq=seq,
        step=intent.step,
        uri=uri,
        reason=intent.reason,
        tier=intent.tier or UNSET,
    )


def _memory_resume(state: RunState, intent: ResumeIntent, *, forced: bool) -> Resumed:
    """`resumed` from the run's memory snapshot with the intent's digest, in the intent's attempt (one the log
    does not hold as its snapshot names seq 0, for the judge to refuse)."""
    snap = state.snapshot
    known = snap is not None and snap.recorded.checkpoint_hash == intent.checkpoint_hash
    return Resumed(
        run_id=state.run_id,
        checkpoint_seq=snap.recorded.seq if snap is not None and known else 0,
        step=intent.step,
        epoch=snap.recorded.epoch if snap is not None and known else 0,
        uri=snap.recorded.uri if snap is not None and known else "",
        checkpoint_hash=intent.checkpoint_hash or "",
        resume_count=state.resume_count + 1,
        forced=forced,
        command=state.launch.command,
        attempt=intent.attempt or state.attempt + 1,
        saved_world=intent.saved_world or UNSET,
        world=intent.world or UNSET,
        data=intent.data or UNSET,
        tier=intent.tier or UNSET,
    )


def _opened_by_supervisor(state: RunState, intent: ResumeIntent) -> bool:
    """The run is in the trainer's attempt, which its supervisor opened from the very checkpoint the trainer
    loaded: the `resumed` is in the log already (one per attempt, unless the trainer had to fall back)."""
    return (
        state.status == "running"
        and intent.attempt != 0
        and state.resumed_in == intent.attempt == state.attempt
        and state.resumed_hash == (intent.checkpoint_hash or "")
    )


def _by_hash(state: RunState, checkpoint_hash: str) -> CheckpointRef | None:
    """The run's checkpoint with this manifest digest, valid or not."""
    return next((c for c in reversed(state.checkpoints) if c.checkpoint_hash == checkpoint_hash), None)


def _unknown(checkpoint_hash: str, step: int, at: datetime) -> CheckpointRef:
    """A checkpoint the log never recorded: seq 0 is no checkpointed event, so the judge refuses what names it."""
    unrecorded = Checkpointed(
        run_id="",
        time=at,
        step=step,
        epoch=0,
        shards=1,
        uri="",
        checkpoint_hash=checkpoint_hash,
        size_bytes=0,
    )
    return CheckpointRef(recorded=unrecorded)
