"""The judge and the fold: whether an event may follow a run's state, and the state it leads to.

Every writer's decision is checked here (the CLI, the outbox, the supervisor), and so is every stored event
when the projector or the audit folds it: one place says which transition is legal, in one set of words.
"""

import msgspec
from msgspec import UnsetType

from ftrain.domain.lifecycle.run_state import CheckpointRef, RunState, SnapshotRef
from ftrain.events.chain import ChainHead
from ftrain.events.schema import (
    SNAPSHOT_TIERS,
    AnyEvent,
    Checkpointed,
    Completed,
    CorruptSkipped,
    Failed,
    Launched,
    Resumed,
    SnapshotReplicated,
    Snapshotted,
    event_type,
)

ATTEMPT_EVENTS = (Checkpointed, Snapshotted, Failed, Completed)
"""The events an attempt's own processes record: each carries the attempt, checked against the fence."""


class IllegalTransition(Exception):
    """The event is not legal in the run's current state; the message names that state."""


def check_open(state: RunState) -> None:
    """A completed run is closed: nothing may follow completion."""
    if state.status == "completed":
        raise IllegalTransition(f"run {state.run_id} is completed; nothing may follow completion")


def check_may_resume(state: RunState, *, forced: bool) -> None:
    """Resume follows a failure; a run the log still thinks is running resumes only when forced."""
    check_open(state)
    if state.status == "running" and not forced:
        raise IllegalTransition(f"run {state.run_id} is running; resume follows a failure (or use --force)")


def check(state: RunState | None, event: AnyEvent) -> None:
    """Raise IllegalTransition unless `event` may follow `state` (None: the run does not exist yet)."""
    if state is None:
        if not isinstance(event, Launched):
            raise IllegalTransition(f"run {event.run_id} does not exist; it cannot be {event_type(event)}")
        return
    if isinstance(event, Launched):
        raise IllegalTransition(f"run {state.run_id} already exists ({state.status})")
    check_open(state)
    if isinstance(event, ATTEMPT_EVENTS):
        check_attempt(state, event.attempt)
        if state.status != "running":
            raise IllegalTransition(
                f"run {state.run_id} is {state.status}; it cannot be {event_type(event)} (resume it first)"
            )
    if isinstance(event, Checkpointed):
        if event.step < 0 or event.epoch < 0 or event.shards < 1:
            raise IllegalTransition("step and epoch must be ≥ 0 and shards ≥ 1")
        if event.step <= state.step and (state.checkpoints or state.resume_count):
            raise IllegalTransition(
                f"run {state.run_id} is at step {state.step}; checkpoint step {event.step} does not advance it"
            )
    elif isinstance(event, Snapshotted):
        _check_snapshot(state, event)
    elif isinstance(event, SnapshotReplicated):
        _check_replicated(state, event)
    elif isinstance(event, CorruptSkipped) and event.tier in SNAPSHOT_TIERS:
        snap = state.snapshot
        if (
            snap is None
            or snap.status != "valid"
            or (snap.recorded.seq, snap.recorded.step)
            != (
                event.checkpoint_seq,
                event.step,
            )
        ):
            raise IllegalTransition(
                f"run {state.run_id} has no valid memory snapshot at seq {event.checkpoint_seq}"
            )
    elif isinstance(event, CorruptSkipped):
        ref = state.checkpoint(event.checkpoint_seq)
        if ref is None or ref.status != "valid" or ref.step != event.step:
            raise IllegalTransition(
                f"run {state.run_id} has no valid checkpoint at seq {event.checkpoint_seq}"
            )
    elif isinstance(event, Resumed):
        _check_resume(state, event)


def _check_snapshot(state: RunState, event: Snapshotted) -> None:
    """Each memory snapshot advances past the one before it until the run resumes (from further back, it
    snapshots those steps again); it never touches the durable tier's order."""
    last = state.snapshot
    if last is not None and last.resumes == state.resume_count and event.step <= last.recorded.step:
        raise IllegalTransition(
            f"run {state.run_id} has a memory snapshot of step {last.recorded.step}; step {event.step} does not "
            "advance it"
        )


def _check_replicated(state: RunState, event: SnapshotReplicated) -> None:
    """The end of the newest snapshot's replica exchange, recorded once by the attempt that took it (while it
    runs, or once it failed: where the copies are matters most then): each node whose part has a replica
    node named once, its counts adding up to the part's ranks."""
    check_attempt(state, event.attempt)
    snap = state.snapshot
    if snap is None or (snap.recorded.seq, snap.recorded.step, snap.recorded.checkpoint_hash) != (
        event.snapshot_seq,
        event.step,
        event.checkpoint_hash,
    ):
        raise IllegalTransition(
            f"run {state.run_id} has no memory snapshot of step {event.step} at seq {event.snapshot_seq} as its newest"
        )
    if snap.replicas is not None:
        raise IllegalTransition(
            f"the replicas of memory snapshot seq {event.snapshot_seq} are recorded already"
        )
    parts = snap.recorded.parts if isinstance(snap.recorded.parts, tuple) else ()
    ranks = {p.node: p.ranks for p in parts if p.replica_node is not None}
    named = [r.node for r in event.replicas]
    if sorted(named) != sorted(ranks) or any(
        r.landed + r.dropped + r.failed != ranks[r.node] for r in event.replicas
    ):
        raise IllegalTransition(
            f"snapshot_replicated must name each replicated part of memory snapshot seq {event.snapshot_seq} "
            "once, its counts adding up to the part's ranks"
        )


def _check_memory_resume(state: RunState, event: Resumed) -> None:
    """A resume from memory names the run's newest snapshot, still valid and newer than every valid durable
    checkpoint (`RunState.memory_candidate`): never one the log did not accept, nor an older one."""
    snap = state.memory_candidate()
    if snap is None or snap.recorded.seq != event.checkpoint_seq:
        raise IllegalTransition(
            f"run {state.run_id} must resume from memory only from its newest valid snapshot newer than its "
            f"durable checkpoints, not seq {event.checkpoint_seq}"
        )
    if snap.recorded.step != event.step or snap.recorded.checkpoint_hash != event.checkpoint_hash:
        raise IllegalTransition(f"resumed event does not match memory snapshot seq {event.checkpoint_seq}")
    _check_resume_count(state, event)


def check_attempt(state: RunState, attempt: int) -> None:
    """Only the current attempt records: an older one's processes (a zombie, a partitioned node) are fenced
    off. An event without an attempt (0) is an old writer's, accepted until the run has seen one with."""
    if attempt == state.attempt or (attempt == 0 and not state.fenced):
        return
    raise IllegalTransition(
        f"run {state.run_id} is in attempt {state.attempt}; an event of attempt {attempt} is refused"
    )


def opened_attempt(state: RunState, event: Resumed) -> int:
    """The attempt the run is in after `event`: it continues the current one, or opens the next."""
    return event.attempt or state.attempt + 1


def named_hosts(event: Resumed) -> tuple[str, ...]:
    """The nodes `event` names for its attempt (empty: none named)."""
    return () if isinstance(event.hosts, UnsetType) else event.hosts


def _check_resume(state: RunState, event: Resumed) -> None:
    if event.attempt and event.attempt not in (state.attempt, state.attempt + 1):
        raise IllegalTransition(
            f"run {state.run_id} is in attempt {state.attempt}; attempt {event.attempt} cannot resume it"
        )
    hosts = named_hosts(event)
    if event.attempt != state.attempt:  # opening an attempt follows a failure
        check_may_resume(state, forced=event.forced)
    else:
        check_open(state)
        if hosts and hosts != state.nodes:
            raise IllegalTransition(
                f"run {state.run_id}: an attempt keeps its nodes; a new one may change them"
            )
    if len(set(hosts)) != len(hosts):
        raise IllegalTransition(f"run {state.run_id}: an attempt names each of its nodes once")
    if event.tier in SNAPSHOT_TIERS:
        _check_memory_resume(state, event)
        return
    if event.checkpoint_seq == 0:
        _check_restart(state, event)
        return
    newest = next(iter(state.valid_checkpoints()), None)
    if newest is None or newest.seq != event.checkpoint_seq:
        raise IllegalTransition(
            f"run {state.run_id} must resume from its newest valid checkpoint, not seq {event.checkpoint_seq}"
        )
    if newest.step != event.step or newest.checkpoint_hash != event.checkpoint_hash:
        raise IllegalTransition(f"resumed event does not match checkpoint seq {event.checkpoint_seq}")
    _check_resume_count(state, event)


def _check_resume_count(state: RunState, event: Resumed) -> None:
    if event.resume_count != state.resume_count + 1:
        raise IllegalTransition(f"resume count must be {state.resume_count + 1}, not {event.resume_count}")


def _check_restart(state: RunState, event: Resumed) -> None:
    """A restart from step 0 (`checkpoint_seq` 0) is legal only for a run that never recorded a checkpoint:
    once one exists, losing them all must stop the run, never silently start it over."""
    if state.checkpoints:
        raise IllegalTransition(
            f"run {state.run_id} has checkpoints; it resumes from one or not at all, never from step 0"
        )
    if event.step != 0 or event.epoch != 0 or event.uri or event.checkpoint_hash:
        raise IllegalTransition("a restart from step 0 names no checkpoint")
    _check_resume_count(state, event)


def apply(state: RunState | None, event: AnyEvent, head: ChainHead) -> RunState:
    """The run state after `event`, whose chain position is `head`. Raises IllegalTransition."""
    check(state, event)
    if state is None:
        assert isinstance(event, Launched)
        return RunState(
            run_id=event.run_id,
            project=event.project,
            status="running",
            launch=event,
            head=head,
            attempt=1,
            gpu_seconds=0.0,
            updated_at=event.time,
            running_since=event.time,
        )
    changes: dict[str, object] = {"head": head, "updated_at": event.time}
    if isinstance(event, ATTEMPT_EVENTS) and event.attempt:
        changes["fenced"] = True
    if isinstance(event, Checkpointed):
        ref = CheckpointRef(recorded=event)
        changes.update(step=event.step, epoch=event.epoch, checkpoints=(*retire(state, event), ref))
    elif isinstance(event, Snapshotted):
        changes["snapshot"] = SnapshotRef(recorded=event, resumes=state.resume_count)
    elif isinstance(event, SnapshotReplicated):
        assert state.snapshot is not None  # checked
        changes["snapshot"] = msgspec.structs.replace(state.snapshot, replicas=event.replicas)
    elif isinstance(event, CorruptSkipped) and event.tier in SNAPSHOT_TIERS:
        assert state.snapshot is not None  # checked
        changes["snapshot"] = msgspec.structs.replace(state.snapshot, status="corrupt", reason=event.reason)
    elif isinstance(event, CorruptSkipped):
        changes["checkpoints"] = tuple(
            msgspec.structs.replace(c, status="corrupt", reason=event.reason)
            if c.seq == event.checkpoint_seq
            else c
            for c in state.checkpoints
        )
    elif isinstance(event, Failed):
        changes.update(
            status="failed",
            failures=state.failures + 1,
            last_failure=event.reason,
            running_since=None,
            running_seconds=state.running_seconds_at(event.time),
            gpu_seconds=state.gpu_seconds_at(event.time),
        )
    elif isinstance(event, Resumed):
        changes.update(
            status="running",
            gpu_seconds=state.gpu_seconds_at(event.time),
            hosts=named_hosts(event) or (state.hosts if event.attempt == state.attempt else ()),
            step=event.step,
            epoch=event.epoch,
            resume_count=event.resume_count,
            running_since=event.time,
            running_seconds=state.running_seconds_at(event.time),
            attempt=opened_attempt(state, event),
            resumed_in=opened_attempt(state, event),
            resumed_hash=event.checkpoint_hash,
            resumed_mlflow_run_id=(
                event.mlflow_run_id if isinstance(event.mlflow_run_id, str) else state.resumed_mlflow_run_id
            ),
        )
    elif isinstance(event, Completed):
        changes.update(
            status="completed",
            running_since=None,
            running_seconds=event.running_seconds,
            cost_gpu_hours=event.cost_gpu_hours,
            cost_source=event.cost_source,
        )
    return msgspec.structs.replace(state, **changes)


def retire(state: RunState, event: Checkpointed) -> tuple[CheckpointRef, ...]:
    """The run's checkpoints once `event` recorded its retention: each `valid` one of a step it retired is
    `pruned` (gone from storage, never a resume candidate); a `corrupt` one stays what the resume found."""
    if not event.retired:
        return state.checkpoints
    gone = set(event.retired)
    return tuple(
        msgspec.structs.replace(c, status="pruned") if c.status == "valid" and c.step in gone else c
        for c in state.checkpoints
    )
