"""The application service: commands become events, queries read the caught-up projection.

Every command is decided against the run's own log (`projections.run_log.RunLog`): the lifecycle's deciders
build the event, its judge checks it, and the append names the run's head as the expected position, deciding
again after a conflict. Queries catch the read model up first (read-your-writes). The CLI is a thin shell
over this class; tests call it directly.
"""

import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

import msgspec
import structlog

from ftrain import settings as ftrain_settings
from ftrain.errors import NotFound, Refused, UsageError
from ftrain.events.chain import ChainHead
from ftrain.events.jetstream.connection import NatsSettings, endpoint_name, open_store
from ftrain.events.jetstream.lease import LeaseStore, LeaseTaken, LeaseView, open_leases
from ftrain.events.lease_record import Holder, held_for
from ftrain.events.log_port import AppendConflict, EventLog, LogTampered
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
from ftrain.history import AuditReport, TimelineEntry, timeline, verify
from ftrain.projections.audit import Finding
from ftrain.projections.goodput import Goodput, measure
from ftrain.projections.lifecycle import (
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
from ftrain.projections.projector import Projector
from ftrain.projections.readmodel import ReadModel, StoredRun, damaged
from ftrain.projections.run_log import BrokenRun, ContendedRun, RunLog
from ftrain.projections.vouching import Unvouched, Vouched
from ftrain.workers import progress
from ftrain.workers.layout import SetAsideKind
from ftrain.workers.storage.errors import OUTSIDE_RUN, CheckpointExists, StorageError, StorageUnavailable
from ftrain.workers.storage.location import parse_root, under_root
from ftrain.workers.storage.one_rank import write_step
from ftrain.workers.storage.open import open_run
from ftrain.workers.storage.port import RunStorage, StepReader, StoredCheckpoint

CONFLICT_RETRIES = 20
T = TypeVar("T")
log = structlog.get_logger(__name__)


class RunView(msgspec.Struct, frozen=True):
    """A run as `status`, `list` and `cost` show it: its state (None when none of its events was accepted),
    the first break of its chain or else its first event no trusted writer vouches for, if any (a broken or
    unvouched run must never look like a healthy one), and who vouches for it."""

    run_id: str
    state: RunState | None
    broken: Finding | None = None
    goodput: Goodput | None = None
    """Its goodput as of now, from its own events (None with no accepted event)."""
    vouched: Vouched | None = None
    """Who vouches for its events under today's trust list (None: no trusted writer, or no event accepted)."""


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


def readmodel_path(settings: NatsSettings) -> Path:
    """One read model per log endpoint, under $FTRAIN_HOME."""
    return settings.home / endpoint_name(settings, "readmodel", ".sqlite")


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


class RunService:
    """Commands and queries over one event store, one read model and one checkpoint storage root."""

    def __init__(
        self,
        store: EventLog,
        model: ReadModel,
        projector: Projector,
        storage: str,
        leases: LeaseStore | None = None,
    ) -> None:
        self.store = store
        self.model = model
        self.projector = projector
        self.storage = storage
        """The storage root `ftrain checkpoint` writes under (canonical URI)."""
        self.leases = leases
        """The supervisor leases (None: opened without them; every lease query and command refuses)."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls, env: Mapping[str, str] = os.environ, *, auditing: bool = False, leases: bool = False
    ) -> AsyncIterator["RunService"]:
        """Connect to the log (starting the embedded server if needed) and open the read model. A stream
        that is not the one anchored raises LogTampered, unless `auditing`: an audit is what reports it.
        `leases`: also connect to the supervisor leases (`status`, `run`)."""
        try:
            settings = ftrain_settings.nats(env)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        storage = checkpoint_storage(env)
        async with open_store(settings) as store:
            try:
                stream_id = await store.ensure_stream()
            except LogTampered:
                if not auditing:
                    raise
                stream_id = facts.created if (facts := await store.facts()) else ""
            model = await ReadModel.open(readmodel_path(settings))
            try:
                async with AsyncExitStack() as stack:
                    lease_store = await stack.enter_async_context(open_leases(settings)) if leases else None
                    yield cls(store, model, Projector(store, model, stream_id), storage, lease_store)
            finally:
                await model.close()

    # -- queries -------------------------------------------------------------------------------------------

    async def state_of(self, run_id: str) -> RunState:
        """The caught-up state of a run; NotFound if the log has never heard of it."""
        try:
            validate_run_id(run_id)
        except InvalidRunId as exc:
            raise UsageError(str(exc)) from exc

        async def read() -> tuple[RunState | None, Finding | None]:
            state = await self.model.run(run_id)
            return state, (await self.model.broken(run_id) if state is None else None)

        state, broken = await self._caught_up(read)
        if state is None:
            if broken is not None:
                raise Refused(f"run {run_id}'s log is broken: {broken.describe()}")
            raise NotFound(f"unknown run {run_id!r}")
        return state

    async def view(self, run_id: str) -> RunView:
        """One run's caught-up state, judged as `views` judges it, with its goodput; NotFound if the log
        never heard of it."""
        try:
            validate_run_id(run_id)
        except InvalidRunId as exc:
            raise UsageError(str(exc)) from exc

        async def read() -> tuple[StoredRun | None, Finding | None]:
            return (await self.model.stored_runs_of([run_id])).get(run_id), await self.model.broken(run_id)

        stored, broken = await self._caught_up(read)
        if stored is None and broken is None:
            raise NotFound(f"unknown run {run_id!r}")
        view = self._judged(run_id, stored, broken)
        return msgspec.structs.replace(view, goodput=await self.goodput(run_id)) if stored else view

    async def views(self, project: str | None = None) -> list[RunView]:
        """Every run, or one project's, each with its chain break or its first unvouched event; broken runs
        without any accepted event are listed only when no project is asked for (their project is unknown)."""

        async def read() -> tuple[list[StoredRun], dict[str, Finding]]:
            return await self.model.stored_runs(project), await self.model.broken_runs()

        runs, broken = await self._caught_up(read)
        stored = {r.state.run_id: r for r in runs}
        ids = stored.keys() | (broken.keys() if project is None else broken.keys() & stored.keys())
        return [self._judged(r, stored.get(r), broken.get(r)) for r in sorted(ids)]

    def _judged(self, run_id: str, stored: StoredRun | None, broken: Finding | None) -> RunView:
        """A run as the views show it: whose signatures its events carry, judged against the trust list as
        it is now (a key revoked since the fold counts as revoked); an unvouched run shows as broken."""
        if stored is None:
            return RunView(run_id, None, broken)
        verdict = stored.vouching(self.store.trust)
        if isinstance(verdict, Unvouched):
            unvouched = Finding(run_id, verdict.stream_seq, verdict.seq, verdict.event_type, verdict.reason)
            return RunView(run_id, stored.state, broken or unvouched)
        return RunView(run_id, stored.state, broken, vouched=verdict)

    async def states(self, project: str | None = None) -> list[RunState]:
        """Every run, or one project's, caught up."""
        return await self._caught_up(lambda: self.model.runs(project))

    async def goodput(self, run_id: str) -> Goodput:
        """A run's goodput as of now, folded from its own events as the chain walk accepts them (the read
        model keeps no per-save figures). The run must have an accepted `launched`."""
        return measure([e.event async for e in timeline(self.store, run_id) if e.event is not None], now())

    async def _caught_up(self, read: Callable[[], Awaitable[T]]) -> T:
        """Catch the model up, then `read` it; a damaged model file ("malformed") is set aside, rebuilt from
        the log with one warning, and read again."""
        try:
            await self.projector.catch_up()
            return await read()
        except sqlite3.DatabaseError as exc:
            if not damaged(exc):
                raise
            await self.projector.heal(exc)
        return await read()

    async def rebuild(self) -> int:
        """Replay the stream into an emptied model (a damaged file is set aside first); records applied."""
        try:
            return await self.projector.rebuild()
        except sqlite3.DatabaseError as exc:
            if not damaged(exc):
                raise
            return await self.projector.heal(exc)

    async def verify(self, run_id: str | None = None) -> AuditReport:
        """Re-verify every chain from the stream itself (not the read model)."""
        return await verify(self.store, run_id)

    async def timeline(self, run_id: str | None = None) -> list[TimelineEntry]:
        """Every event in stream order, each with its verdict."""
        return [entry async for entry in timeline(self.store, run_id)]

    # -- the command loop ----------------------------------------------------------------------------------

    async def _record(self, run_id: str, decide: Callable[[RunState], AnyEvent | None]) -> AnyEvent | None:
        """Decide against the run's own log and append, deciding again after every conflict; None when the
        decider finds the state already reflects the request (or another writer changed it: decide anew)."""
        try:
            appended = await RunLog(self.store, run_id).append(
                lambda state: None if state is None else decide(state)
            )
        except BrokenRun as exc:
            raise Refused(
                f"run {run_id}'s log is broken, refusing to append: {exc.finding.describe()}"
            ) from exc
        except (IllegalTransition, ContendedRun) as exc:
            raise Refused(str(exc)) from exc
        if appended is None:
            return None
        log.info("appended", run_id=run_id, type=event_type(appended.event), seq=appended.event.seq)
        return appended.event

    # -- the supervisor lease ------------------------------------------------------------------------------

    def _lease_store(self) -> LeaseStore:
        if self.leases is None:
            raise RuntimeError("RunService opened without leases")
        return self.leases

    async def lease(self, run_id: str) -> LeaseView:
        """The run's supervisor lease as the bucket's leader has it. Raises LogUnavailable."""
        return await self._lease_store().read(run_id)

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
        state = await self._vouched_state(run_id)
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
            lost = await self._record(run_id, partial(supervisor_lost, holder=old)) if old else None
        except BaseException:
            await leases.release(run_id, revision)
            raise
        assert lost is None or isinstance(lost, Failed)
        return Claim(revision, lost)

    async def release(self, run_id: str, revision: int) -> None:
        """Give up a lease this process took at `revision` (a relaunch refused after all)."""
        await self._lease_store().release(run_id, revision)

    # -- commands ------------------------------------------------------------------------------------------

    async def launch(self, make: Callable[[str], Launched], candidates: Callable[[], list[str]]) -> Launched:
        """Append `launched` under the first free run id among `candidates()`."""
        for _ in range(CONFLICT_RETRIES):
            await self.projector.catch_up()
            free = [c for c in candidates() if not await self.model.taken(c)]
            if not free:
                raise Refused(f"run {candidates()[0]} already exists")
            try:
                appended = await self.store.append(make(free[0]), ChainHead())
            except AppendConflict:
                continue
            assert isinstance(appended.event, Launched)
            return appended.event
        raise Refused("gave up picking a run id after repeated concurrent launches")

    async def checkpoint(
        self,
        run_id: str,
        *,
        step: int,
        epoch: int,
        shards: int,
        sources: list[tuple[str, bytes | Path]],
    ) -> Checkpointed:
        """Write the checkpoint directory (manifest and marker last), then append `checkpointed`."""
        state = await self.state_of(run_id)

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
                )
        except CheckpointExists as exc:
            if any(c.step == step for c in (await self.state_of(run_id)).checkpoints):
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
            event = await self._record(run_id, partial(event_for, written))
        except BaseException:
            writer.discard(written.uri)
            raise
        assert isinstance(event, Checkpointed)
        return event

    async def fail(self, run_id: str, *, reason: str, exit_code: int | None, message: str = "") -> Failed:
        """Record a failure or preemption."""
        await self.state_of(run_id)
        event = await self._record(
            run_id,
            lambda current: Failed(
                run_id=run_id,
                reason=reason,
                exit_code=exit_code,
                message=message,
                attempt=current.attempt,
            ),
        )
        assert isinstance(event, Failed)
        return event

    async def complete(self, run_id: str, *, cost_gpu_hours: float | None) -> Completed:
        """Record completion, with reported GPU-hours or running wall time × GPUs."""
        await self.state_of(run_id)
        event = await self._record(run_id, lambda state: completed_event(state, cost_gpu_hours, now()))
        assert isinstance(event, Completed)
        return event

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
        state = await self._vouched_state(run_id)
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
                fresh = await self._vouched_state(run_id)
                if fresh.head == state.head:
                    raise
                # another resume set this checkpoint aside while it was read: its skip or resume is in the log
                state, plan = fresh, self._plan(fresh, force)
                continue
            if reason is None:
                appended = await self._record(run_id, partial(resume_from, ref=candidate.ref, forced=force))
                if isinstance(appended, Resumed):
                    return ResumeOutcome(skipped, appended, await self.model.run(run_id))
            else:
                appended = await self._record(run_id, partial(skip, ref=candidate.ref, reason=reason))
                if isinstance(appended, CorruptSkipped):
                    skipped.append(appended)
                    if uri:
                        _set_aside(storage, uri, "corrupt", str(appended.seq))
                    if on_skip is not None:
                        await on_skip(appended)
            state = await self._vouched_state(run_id)
            plan = self._plan(state, force)
        return ResumeOutcome(skipped, None, state)

    async def _vouched_state(self, run_id: str) -> RunState:
        """The run's state from its own log, only when its chain holds and a trusted writer vouches for it:
        what a resume reads checkpoints by (the read model is a view, never a warrant)."""
        try:
            validate_run_id(run_id)
            state = await RunLog(self.store, run_id).state()
        except InvalidRunId as exc:
            raise UsageError(str(exc)) from exc
        except BrokenRun as exc:
            raise Refused(
                f"run {run_id}'s log is broken, refusing to act on it: {exc.finding.describe()}"
            ) from exc
        if state is None:
            raise NotFound(f"unknown run {run_id!r}")
        return state

    def _plan(self, state: RunState, force: bool) -> ResumePlan:
        try:
            return plan_resume(state, _launched_storage(state).complete(), forced=force)
        except IllegalTransition as exc:
            raise Refused(str(exc)) from exc


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
