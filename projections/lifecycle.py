"""The run state machine as a pure fold: the one place that says which transition is legal."""

from datetime import datetime
from typing import Literal

import msgspec

from events.chain import ChainHead
from events.schema import (
    AnyEvent,
    Checkpointed,
    Completed,
    CorruptSkipped,
    Failed,
    Launched,
    Resumed,
    event_type,
)

RunStatus = Literal["running", "failed", "completed"]


class CheckpointRef(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint the log knows of; `status` turns to "corrupt" when a resume skipped it."""

    seq: int
    step: int
    epoch: int
    shards: int
    uri: str
    checkpoint_hash: str
    size_bytes: int
    time: datetime
    status: Literal["valid", "corrupt"] = "valid"
    reason: str | None = None


class RunState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the log says about one run, folded from its events."""

    run_id: str
    project: str
    status: RunStatus
    launch: Launched
    head: ChainHead
    updated_at: datetime
    step: int = 0
    epoch: int = 0
    resume_count: int = 0
    failures: int = 0
    last_failure: str | None = None
    checkpoints: tuple[CheckpointRef, ...] = ()
    running_since: datetime | None = None
    running_seconds: float = 0.0
    cost_gpu_hours: float | None = None
    cost_source: str | None = None

    @property
    def gpus(self) -> int:
        """GPUs allocated to the run."""
        return self.launch.nodes * self.launch.gpus_per_node

    def valid_checkpoints(self) -> list[CheckpointRef]:
        """Checkpoints not known to be corrupt, newest first."""
        return [c for c in reversed(self.checkpoints) if c.status == "valid"]

    def checkpoint(self, seq: int) -> CheckpointRef | None:
        """The checkpoint recorded by event `seq`."""
        return next((c for c in self.checkpoints if c.seq == seq), None)

    def running_seconds_at(self, moment: datetime) -> float:
        """Wall time spent running, counting the current attempt up to `moment`."""
        current = (moment - self.running_since).total_seconds() if self.running_since else 0.0
        return self.running_seconds + max(current, 0.0)

    def gpu_hours_at(self, moment: datetime) -> float:
        """Reported cost once completed, else running wall time × GPUs."""
        if self.cost_gpu_hours is not None:
            return self.cost_gpu_hours
        return self.running_seconds_at(moment) * self.gpus / 3600.0


class IllegalTransition(Exception):
    """The event is not legal in the run's current state; the message names that state."""


def check(state: RunState | None, event: AnyEvent) -> None:
    """Raise IllegalTransition unless `event` may follow `state` (None: the run does not exist yet)."""
    kind = event_type(event)
    if state is None:
        if not isinstance(event, Launched):
            raise IllegalTransition(f"run {event.run_id} does not exist; it cannot be {kind}")
        return
    where = f"run {state.run_id} is {state.status}"
    if isinstance(event, Launched):
        raise IllegalTransition(f"run {state.run_id} already exists ({state.status})")
    if state.status == "completed":
        raise IllegalTransition(f"{where}; nothing may follow completion")
    if isinstance(event, Checkpointed | Failed | Completed) and state.status != "running":
        raise IllegalTransition(f"{where}; it cannot be {kind} (resume it first)")
    if isinstance(event, Checkpointed):
        if event.step < 0 or event.epoch < 0 or event.shards < 1:
            raise IllegalTransition("step and epoch must be ≥ 0 and shards ≥ 1")
        if event.step <= state.step and (state.checkpoints or state.resume_count):
            raise IllegalTransition(
                f"run {state.run_id} is at step {state.step}; checkpoint step {event.step} does not advance it"
            )
    elif isinstance(event, CorruptSkipped):
        ref = state.checkpoint(event.checkpoint_seq)
        if ref is None or ref.status != "valid" or ref.step != event.step:
            raise IllegalTransition(
                f"run {state.run_id} has no valid checkpoint at seq {event.checkpoint_seq}"
            )
    elif isinstance(event, Resumed):
        _check_resume(state, event)


def _check_resume(state: RunState, event: Resumed) -> None:
    if state.status == "running" and not event.forced:
        raise IllegalTransition(f"run {state.run_id} is running; resume follows a failure (or use --force)")
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
    if event.resume_count != state.resume_count + 1:
        raise IllegalTransition(f"resume count must be {state.resume_count + 1}, not {event.resume_count}")


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
            updated_at=event.time,
            running_since=event.time,
        )
    changes: dict[str, object] = {"head": head, "updated_at": event.time}
    if isinstance(event, Checkpointed):
        ref = CheckpointRef(
            seq=event.seq,
            step=event.step,
            epoch=event.epoch,
            shards=event.shards,
            uri=event.uri,
            checkpoint_hash=event.checkpoint_hash,
            size_bytes=event.size_bytes,
            time=event.time,
        )
        changes.update(step=event.step, epoch=event.epoch, checkpoints=(*state.checkpoints, ref))
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
        )
    elif isinstance(event, Resumed):
        changes.update(
            status="running",
            step=event.step,
            epoch=event.epoch,
            resume_count=event.resume_count,
            running_since=event.time,
            running_seconds=state.running_seconds_at(event.time),
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


def resumed_event(state: RunState, ref: CheckpointRef, *, forced: bool) -> Resumed:
    """The `resumed` event for resuming `state` from checkpoint `ref`, relaunching the launch command."""
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
    )


def restart_event(state: RunState, *, forced: bool) -> Resumed:
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
    )


def corrupt_skipped_event(state: RunState, ref: CheckpointRef, reason: str) -> CorruptSkipped:
    """The `corrupt_skipped` event refusing checkpoint `ref` for `reason`."""
    return CorruptSkipped(
        run_id=state.run_id, checkpoint_seq=ref.seq, step=ref.step, uri=ref.uri, reason=reason
    )
