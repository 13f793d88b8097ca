"""The commands: what `launch`, `checkpoint`, `fail`, `complete`, `resume` and a relaunch's claim append.

Each decides against its run's own log (`domain.command_handler.RunLog`), read once and then only for what
landed since: the lifecycle's deciders build the event, its judge checks it, and the append names the run's
head as the expected position, deciding again after a conflict. Nothing here reads the read model.
"""

import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import NamedTuple

import msgspec
import structlog

from ftrain import settings as ftrain_settings
from ftrain.domain.command_handler import BrokenRun, ContendedRun, RunLog
from ftrain.domain.lifecycle import (
    IllegalTransition,
    ResumePlan,
    RunState,
    check,
    check_open,
    completed_event,
    plan_resume,
    resume_from,
    skip,
    supervisor_lost,
)
from ftrain.errors import NotFound, Refused, UsageError
from ftrain.events.chain import ChainHead
from ftrain.events.jetstream.lease import LeaseStore, LeaseTaken
from ftrain.events.lease_record import Holder, held_for
from ftrain.events.log_port import AppendConflict, Appended, EventLog
from ftrain.events.run_id import InvalidRunId, validate_run_id
from ftrain.events.schema import (
    AnyEvent,
    Checkpointed,
    Completed,
    CorruptSkipped,
    Failed,
    Launched,
    Resumed,
    event_type,
    now,
)
from ftrain.workers import progress
from ftrain.workers.integrity import ALGORITHM
from ftrain.workers.layout import SetAsideKind
from ftrain.workers.storage.location import parse_root, under_root
from ftrain.workers.storage.one_rank import write_step
from ftrain.workers.storage.open import open_run
from ftrain.workers.storage.port import RunStorage, StepReader, StoredCheckpoint
from ftrain.workers.storage.storage_errors import (
    OUTSIDE_RUN,
    CheckpointExists,
    StorageError,
    StorageUnavailable,
)

log = structlog.get_logger(__name__)


class Claim(NamedTuple):
    """A lease a relaunch took: its revision, and the `failed` (lost) it recorded for the supervisor it
    took the run over from (None: the run had failed already)."""

    revision: int
    lost: Failed | None


class ResumeOutcome(msgspec.Struct, frozen=True):
    """What `resume` did: the checkpoints it skipped, newest first, and the resume it recorded."""

    skipped: list[CorruptSkipped]
    resumed: Resumed | None
    state: RunState | None


def checkpoint_storage(env: Mapping[str, str]) -> str:
    """Where `ftrain checkpoint` writes, as the canonical URI a `launched` event records: $FTRAIN_STORAGE (a
    path, `file://` or `s3://` URI), default $FTRAIN_HOME/checkpoints. A root ftrain cannot use is a usage
    error."""
    try:
        return parse_root(ftrain_settings.storage(env))[1]
    except StorageError as exc:
        raise UsageError(str(exc)) from exc


def run_storage(root: str, run_id: str) -> RunStorage:
    """Run `run_id`'s checkpoints under the storage root `root`, as one process outside the run's attempts
    uses them (a one-rank writer, a reader); a root ftrain cannot use is a usage error."""
    try:
        return open_run(under_root(root, run_id))
    except StorageError as exc:
        raise UsageError(str(exc)) from exc


class RunCommands:
    """The commands over one event store and one checkpoint storage root."""

    def __init__(self, store: EventLog, storage: str, leases: LeaseStore | None = None) -> None:
        self.store = store
        self.storage = storage
        """The storage root `ftrain checkpoint` writes under (canonical URI)."""
        self.leases = leases
        """The supervisor leases (None: opened without them; every lease query and command refuses)."""

    # -- the command loop ----------------------------------------------------------------------------------

    def _run_log(self, run_id: str) -> RunLog:
        """The log of the run a command names; a run id that cannot be one is a usage error."""
        try:
            validate_run_id(run_id)
        except InvalidRunId as exc:
            raise UsageError(str(exc)) from exc
        return RunLog(self.store, run_id)

    async def _record(self, run: RunLog, decide: Callable[[RunState], AnyEvent | None]) -> Appended | None:
        """Decide against the run's own log and append, deciding again after every conflict; None when the
        decider finds the state already reflects the request (or another writer changed it: decide anew).
        NotFound when the log never heard of the run."""
        try:
            appended = await run.append(lambda state: decide(_known(run.run_id, state)))
        except BrokenRun as exc:
            raise _not_appending(exc) from exc
        except (IllegalTransition, ContendedRun) as exc:
            raise Refused(str(exc)) from exc
        if appended is None:
            return None
        log.info("appended", run_id=run.run_id, type=event_type(appended.event), seq=appended.event.seq)
        return appended

    async def _state(self, run: RunLog) -> RunState:
        """The run's state from its own log, to decide an append by (what landed since the last read only)."""
        try:
            return _known(run.run_id, await run.state())
        except BrokenRun as exc:
            raise _not_appending(exc) from exc

    async def vouched_state(self, run_id: str) -> RunState:
        """The run's state from its own log, only when its chain holds and a trusted writer vouches for it:
        what an export reads a checkpoint by, as a resume does."""
        return await self._vouched_state(self._run_log(run_id))

    async def _vouched_state(self, run: RunLog) -> RunState:
        """The run's state from its own log, only when its chain holds and a trusted writer vouches for it:
        what a relaunch and a resume act on (the read model is a view, never a warrant)."""
        try:
            state = await run.state()
        except BrokenRun as exc:
            raise Refused(
                f"run {run.run_id}'s log is broken, refusing to act on it: {exc.finding.describe()}"
            ) from exc
        return _known(run.run_id, state)

    # -- the supervisor lease ------------------------------------------------------------------------------

    def _lease_store(self) -> LeaseStore:
        if self.leases is None:
            raise RuntimeError("RunService opened without leases")
        return self.leases

    async def take_lease(self, run_id: str, holder: Holder) -> int:
        """Take the lease of a run just launched (its id was free: no one else leases it); its revision."""
        leases = self._lease_store()
        return await leases.take(run_id, holder, (await leases.read(run_id)).revision)

    async def claim(self, run_id: str, holder: Holder) -> Claim:
        """Take an existing run's supervisor lease for a relaunch by `holder`: the relaunch decision.

        A live lease is watched for up to its TTL: renewed (or released), its supervisor is alive and the
        relaunch is refused, as before; expired, it is taken by compare-and-set (of two relaunches racing,
        one wins), and a run the log still says is running is recorded `failed` (reason `lost`, naming the
        old holder) before the relaunch opens its attempt. A run never leased keeps the refusal that asks
        for `ftrain fail`. A log or bucket out of reach raises LogUnavailable: nothing is decided then."""
        leases = self._lease_store()
        run = self._run_log(run_id)
        state = await self._vouched_state(run)
        try:
            check_open(state)
        except IllegalTransition as exc:
            raise Refused(str(exc)) from exc
        view = await leases.read(run_id)
        if view.live:
            expired, view = await leases.until_expired(run_id, view)
            if not expired:
                raise Refused(_held(run_id, view.holder, "holds its lease"))
        old = view.holder.describe() if view.holder else None
        holder = msgspec.structs.replace(holder, attempt=state.attempt + 1)  # the attempt it will open
        if state.status == "running" and old is None:
            try:
                supervisor_lost(state, None)
            except IllegalTransition as exc:
                raise Refused(str(exc)) from exc
        try:
            revision = await leases.take(run_id, holder, view.revision)
        except LeaseTaken as exc:
            raise Refused(_held(run_id, (await leases.read(run_id)).holder, "took its lease first")) from exc
        try:
            appended = await self._record(run, partial(supervisor_lost, holder=old)) if old else None
        except BaseException:
            await leases.release(run_id, revision)
            raise
        lost = appended.event if appended else None
        assert lost is None or isinstance(lost, Failed)
        return Claim(revision, lost)

    async def release(self, run_id: str, revision: int) -> None:
        """Give up a lease this process took at `revision` (a relaunch refused after all)."""
        await self._lease_store().release(run_id, revision)

    # -- commands ------------------------------------------------------------------------------------------

    async def launch(self, make: Callable[[str], Launched], candidates: Callable[[], list[str]]) -> Launched:
        """Append `launched` under the first free run id among `candidates()`: one whose own log holds no
        event, accepted or not. The append itself tells: it expects the run's log to be empty, and another
        launch that took the id first makes it conflict."""
        ids = candidates()
        for run_id in ids:
            try:
                appended = await self.store.append(make(run_id), ChainHead())
            except AppendConflict:
                continue
            assert isinstance(appended.event, Launched)
            return appended.event
        raise Refused(f"run {ids[0]} already exists")

    async def checkpoint(
        self,
        run_id: str,
        *,
        step: int,
        epoch: int,
        shards: int,
        sources: list[tuple[str, bytes | Path]],
        digest: str = ALGORITHM,
    ) -> Checkpointed:
        """Write the checkpoint directory (its files hashed by `digest`; manifest and marker last), then append
        `checkpointed`."""
        run = self._run_log(run_id)
        state = await self._state(run)

        def event_for(written: StoredCheckpoint | None, current: RunState = state) -> Checkpointed:
            return Checkpointed(
                run_id=run_id,
                step=step,
                epoch=epoch,
                shards=shards,
                uri=written.uri if written else "",
                checkpoint_hash=written.checkpoint_hash if written else "",
                size_bytes=written.manifest.size_bytes if written else 0,
                attempt=current.attempt,  # an operator records in the current attempt
            )

        try:
            check(state, event_for(None))
        except IllegalTransition as exc:
            raise Refused(str(exc)) from exc
        writer = run_storage(self.storage, run_id)
        try:
            with progress.shown(f"write step {step}", sum(_size(src) for _, src in sources)):
                written = write_step(
                    writer,
                    run_id=run_id,
                    step=step,
                    epoch=epoch,
                    shards=shards,
                    sources=sources,
                    world_size=state.gpus,
                    dataset_revision=state.launch.dataset_revision,
                    algorithm=digest,
                )
        except CheckpointExists as exc:
            if any(c.step == step for c in (await self._state(run)).checkpoints):
                raise Refused(
                    f"run {run_id} already has checkpoint step {step} (another writer got there first)"
                ) from exc
            raise Refused(
                f"{exc} but the log has no such checkpoint yet: another writer may be recording it, or a save "
                "was interrupted (then remove it)"
            ) from exc
        except StorageUnavailable as exc:
            raise Refused(f"{exc}; nothing recorded") from exc
        try:
            appended = await self._record(run, partial(event_for, written))
        except BaseException:
            writer.discard(written.uri)
            raise
        assert appended is not None and isinstance(appended.event, Checkpointed)
        return appended.event

    async def fail(self, run_id: str, *, reason: str, exit_code: int | None, message: str = "") -> Failed:
        """Record a failure or preemption."""
        appended = await self._record(
            self._run_log(run_id),
            lambda current: Failed(
                run_id=run_id,
                reason=reason,
                exit_code=exit_code,
                message=message,
                attempt=current.attempt,
            ),
        )
        assert appended is not None and isinstance(appended.event, Failed)
        return appended.event

    async def complete(self, run_id: str, *, cost_gpu_hours: float | None) -> Completed:
        """Record completion, with reported GPU-hours or running wall time × GPUs."""
        appended = await self._record(
            self._run_log(run_id), lambda state: completed_event(state, cost_gpu_hours, now())
        )
        assert appended is not None and isinstance(appended.event, Completed)
        return appended.event

    async def resume(
        self,
        run_id: str,
        *,
        force: bool = False,
        on_skip: Callable[[CorruptSkipped], Awaitable[None]] | None = None,
    ) -> ResumeOutcome:
        """Execute the lifecycle's resume plan: set aside what the log never recorded, then walk the
        candidates newest first, skipping (and recording) each invalid one, resuming from the first valid one.
        Storage that cannot be read is refused, never taken for corruption: nothing more is recorded."""
        try:
            return await self._resume(run_id, force, on_skip)
        except StorageUnavailable as exc:
            raise Refused(f"{exc}; nothing recorded, the checkpoints are untouched") from exc

    async def _resume(
        self, run_id: str, force: bool, on_skip: Callable[[CorruptSkipped], Awaitable[None]] | None
    ) -> ResumeOutcome:
        run = self._run_log(run_id)
        state = await self._vouched_state(run)
        storage = _launched_storage(state)
        plan = self._plan(state, force)
        for unrecorded in plan.unrecorded:
            _set_aside(storage, unrecorded.uri, "unrecorded", str(int(time.time())))
        skipped: list[CorruptSkipped] = []
        while plan.candidates:
            candidate = plan.candidates[0]
            assert candidate.ref is not None and candidate.digest is not None
            # a URI elsewhere is refused unread and never moved
            uri = storage.confined(candidate.uri)
            try:
                with progress.shown(f"verify step {candidate.step}", candidate.ref.recorded.size_bytes):
                    reason = (
                        storage.verify(uri, candidate.digest, run_id=run_id, step=candidate.step)
                        if uri
                        else OUTSIDE_RUN
                    )
            except StorageUnavailable:
                fresh = await self._vouched_state(run)
                if fresh.head == state.head:
                    raise
                # another resume set this checkpoint aside while it was read: its skip or resume is in the log
                state, plan = fresh, self._plan(fresh, force)
                continue
            if reason is None:
                appended = await self._record(run, partial(resume_from, ref=candidate.ref, forced=force))
                if appended is not None and isinstance(appended.event, Resumed):
                    return ResumeOutcome(skipped, appended.event, run.after(appended))
            else:
                appended = await self._record(run, partial(skip, ref=candidate.ref, reason=reason))
                if appended is not None and isinstance(skipped_event := appended.event, CorruptSkipped):
                    skipped.append(skipped_event)
                    if uri:
                        _set_aside(storage, uri, "corrupt", str(skipped_event.seq))
                    if on_skip is not None:
                        await on_skip(skipped_event)
            state = await self._vouched_state(run)
            plan = self._plan(state, force)
        return ResumeOutcome(skipped, None, state)

    def _plan(self, state: RunState, force: bool) -> ResumePlan:
        try:
            return plan_resume(state, _launched_storage(state).complete(), forced=force)
        except IllegalTransition as exc:
            raise Refused(str(exc)) from exc


def _known(run_id: str, state: RunState | None) -> RunState:
    """The state of a run its log has heard of; NotFound for one it never has."""
    if state is None:
        raise NotFound(f"unknown run {run_id!r}")
    return state


def _not_appending(exc: BrokenRun) -> Refused:
    """The refusal to append to a run whose log is broken: the break alone when none of its events was
    accepted (the run is its break), else what is refused."""
    if exc.accepted is None:
        return Refused(str(exc))
    return Refused(f"run {exc.finding.run_id}'s log is broken, refusing to append: {exc.finding.describe()}")


def _held(run_id: str, holder: Holder | None, what: str) -> str:
    """The refusal of a relaunch while another supervisor holds the run's lease."""
    return f"run {run_id} is running (another supervisor?): {held_for(holder)} {what}"


def _size(src: bytes | Path) -> int:
    """Bytes a checkpoint source holds (for the progress bar)."""
    return len(src) if isinstance(src, bytes) else src.stat().st_size


def _launched_storage(state: RunState) -> StepReader:
    """The run's checkpoints under the storage root its `launched` event configured (never today's
    FTRAIN_STORAGE)."""
    return run_storage(state.launch.storage, state.run_id)


def _set_aside(storage: StepReader, uri: str, kind: SetAsideKind, tag: str) -> None:
    """Quarantine a checkpoint; failing to move it never undoes what the log recorded."""
    try:
        storage.quarantine(uri, kind, tag)
    except (OSError, StorageUnavailable) as exc:
        log.warning("set_aside_failed", uri=uri, error=str(exc))
