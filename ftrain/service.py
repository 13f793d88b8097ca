"""The application service: commands become events, queries read the caught-up projection.

Every command follows one loop: catch the read model up, decide the event against the run's state (the fold's
`check` is the only judge of legality), append it with the run's head as the expected position, and on a
conflict start over from the new state. The CLI is a thin shell over this class; tests call it directly.
"""

import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import msgspec
import structlog

from events.chain import ChainHead
from events.jetstream.connection import NatsSettings, ftrain_home, open_store, settings_from_env
from events.jetstream.store import AppendConflict, Appended, EventStore
from events.run_id import InvalidRunId, validate_run_id
from events.schema import (
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
from ftrain.errors import Refused, UsageError
from projections.audit import ChainWalk, Finding
from projections.lifecycle import (
    CheckpointRef,
    IllegalTransition,
    RunState,
    check,
    resumed_event,
)
from projections.projector import Projector
from projections.readmodel import ReadModel
from workers.checkpoint_dir import (
    CheckpointExists,
    StorageError,
    WrittenCheckpoint,
    remove_checkpoint,
    set_aside,
    storage_root,
    uri_path,
    verify_checkpoint,
    write_checkpoint,
)
from workers.outbox import completed_event

CONFLICT_RETRIES = 20
log = structlog.get_logger(__name__)

Decide = Callable[[RunState | None], AnyEvent | None]


class ResumeOutcome(msgspec.Struct, frozen=True):
    """What `resume` did: the checkpoints it skipped, newest first, and the resume it recorded."""

    skipped: list[CorruptSkipped]
    resumed: Resumed | None
    state: RunState | None


class AuditReport(msgspec.Struct, frozen=True):
    """`audit verify`: events checked, runs seen, and the first break of each broken run."""

    events: int
    runs: int
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        """True when every chain verified."""
        return not self.findings


class TimelineEntry(msgspec.Struct, frozen=True):
    """One record of `replay`: the event when it folded, or the break it caused."""

    stream_seq: int
    run_id: str
    event_type: str
    event: AnyEvent | None
    hash: str | None
    finding: Finding | None


def readmodel_path(settings: NatsSettings) -> Path:
    """One read model per log endpoint, under $FTRAIN_HOME."""
    if settings.url is None:
        return settings.home / "readmodel.sqlite"
    return settings.home / f"readmodel-{hashlib.sha256(settings.url.encode()).hexdigest()[:12]}.sqlite"


def checkpoint_storage(env: Mapping[str, str]) -> Path:
    """Where `ftrain checkpoint` writes: $FTRAIN_STORAGE, default $FTRAIN_HOME/checkpoints."""
    try:
        return storage_root(env.get("FTRAIN_STORAGE") or str(ftrain_home(env) / "checkpoints"))
    except StorageError as exc:
        raise UsageError(str(exc)) from exc


class Ftrain:
    """Commands and queries over one event store, one read model and one checkpoint storage root."""

    def __init__(self, store: EventStore, model: ReadModel, projector: Projector, storage: Path) -> None:
        self.store = store
        self.model = model
        self.projector = projector
        self.storage = storage

    @classmethod
    @asynccontextmanager
    async def open(cls, env: Mapping[str, str] = os.environ) -> AsyncIterator["Ftrain"]:
        """Connect to the log (starting the embedded server if needed) and open the read model."""
        try:
            settings = settings_from_env(env)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        storage = checkpoint_storage(env)
        async with open_store(settings) as store:
            stream_id = await store.ensure_stream()
            model = await ReadModel.open(readmodel_path(settings))
            try:
                yield cls(store, model, Projector(store, model, stream_id), storage)
            finally:
                await model.close()

    # -- queries -------------------------------------------------------------------------------------------

    async def run(self, run_id: str) -> RunState:
        """The caught-up state of a run; UsageError if the log has never heard of it."""
        try:
            validate_run_id(run_id)
        except InvalidRunId as exc:
            raise UsageError(str(exc)) from exc
        await self.projector.catch_up()
        state = await self.model.run(run_id)
        if state is None:
            broken = await self.model.broken(run_id)
            if broken is not None:
                raise Refused(f"run {run_id}'s log is broken: {broken.describe()}")
            raise UsageError(f"unknown run {run_id!r}")
        return state

    async def runs(self, project: str | None = None) -> list[RunState]:
        """Every run, or one project's, caught up."""
        await self.projector.catch_up()
        return await self.model.runs(project)

    async def verify(self, run_id: str | None = None) -> AuditReport:
        """Re-verify every chain from the stream itself: hashes, links, sequence, and legal transitions."""
        walk, events = ChainWalk(), 0
        async for records in self.store.read(1, run_id=run_id):
            for record in records:
                walk.feed(record)
            events += len(records)
        return AuditReport(events, len(walk.states.keys() | walk.broken), list(walk.findings.values()))

    async def timeline(self, run_id: str | None = None) -> list[TimelineEntry]:
        """Every event in stream order, each with its verdict."""
        return [entry async for entry in self._walk(run_id, ChainWalk())]

    async def _walk(self, run_id: str | None, walk: ChainWalk) -> AsyncIterator[TimelineEntry]:
        async for records in self.store.read(1, run_id=run_id):
            for record in records:
                outcome = walk.feed(record)
                if isinstance(outcome, Finding):
                    yield TimelineEntry(
                        record.stream_seq, record.run_id, record.event_type, None, None, outcome
                    )
                else:
                    event, digest = outcome.event, outcome.hash
                    yield TimelineEntry(
                        record.stream_seq, record.run_id, record.event_type, event, digest, None
                    )

    # -- the command loop ----------------------------------------------------------------------------------

    async def _append(self, run_id: str, decide: Decide) -> Appended | None:
        """Decide against the current state and append, re-deciding after every conflict."""
        for _ in range(CONFLICT_RETRIES):
            await self.projector.catch_up()
            broken = await self.model.broken(run_id)
            if broken is not None:
                raise Refused(f"run {run_id}'s log is broken, refusing to append: {broken.describe()}")
            state = await self.model.run(run_id)
            event = decide(state)
            if event is None:
                return None
            try:
                check(state, event)
            except IllegalTransition as exc:
                raise Refused(str(exc)) from exc
            try:
                appended = await self.store.append(event, state.head if state else ChainHead())
            except AppendConflict:
                log.info("append_conflict", run_id=run_id)
                continue
            log.info("appended", run_id=run_id, type=event_type(appended.event), seq=appended.event.seq)
            return appended
        raise Refused(f"run {run_id}: gave up after {CONFLICT_RETRIES} conflicting concurrent appends")

    async def _append_event(self, run_id: str, decide: Decide) -> AnyEvent:
        appended = await self._append(run_id, decide)
        assert appended is not None
        return appended.event

    # -- commands ------------------------------------------------------------------------------------------

    async def launch(self, make: Callable[[str], Launched], candidates: Callable[[], list[str]]) -> Launched:
        """Append `launched` under the first free run id among `candidates()`."""
        for _ in range(CONFLICT_RETRIES):
            await self.projector.catch_up()
            free = [c for c in candidates() if not await self.model.taken(c)]
            if not free:
                raise Refused(f"run {candidates()[0]} already exists")
            run_id = free[0]
            try:
                appended = await self.store.append(make(run_id), ChainHead())
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
        state = await self.run(run_id)

        def event_for(written: WrittenCheckpoint | None) -> Checkpointed:
            return Checkpointed(
                run_id=run_id,
                step=step,
                epoch=epoch,
                shards=shards,
                uri=written.uri if written else "",
                checkpoint_hash=written.checkpoint_hash if written else "",
                size_bytes=written.manifest.size_bytes if written else 0,
            )

        try:
            check(state, event_for(None))
        except IllegalTransition as exc:
            raise Refused(str(exc)) from exc
        try:
            written = write_checkpoint(
                self.storage,
                run_id=run_id,
                step=step,
                epoch=epoch,
                shards=shards,
                sources=sources,
                world_size=state.gpus,
                dataset_revision=state.launch.dataset_revision,
            )
        except CheckpointExists as exc:
            raise Refused(
                f"{exc} but the log has no such checkpoint (an interrupted save?); remove it"
            ) from exc
        try:
            event = await self._append_event(run_id, lambda _: event_for(written))
        except BaseException:
            remove_checkpoint(written.path)
            raise
        assert isinstance(event, Checkpointed)
        return event

    async def fail(self, run_id: str, *, reason: str, exit_code: int | None, message: str = "") -> Failed:
        """Record a failure or preemption."""
        await self.run(run_id)
        event = await self._append_event(
            run_id, lambda _: Failed(run_id=run_id, reason=reason, exit_code=exit_code, message=message)
        )
        assert isinstance(event, Failed)
        return event

    async def record(self, run_id: str, decide: Callable[[RunState], AnyEvent | None]) -> Appended | None:
        """Append what `decide` makes of the run's current state; None when it says the state already
        reflects it. For events wanted long before they are appended (the outbox): deciding happens here,
        against the state at append time, and the fold still judges."""
        await self.run(run_id)  # an unknown run is a usage error, a broken log a refusal
        return await self._append(run_id, lambda state: None if state is None else decide(state))

    async def complete(self, run_id: str, *, cost_gpu_hours: float | None) -> Completed:
        """Record completion, with reported GPU-hours or running wall time × GPUs."""
        await self.run(run_id)

        def decide(state: RunState | None) -> Completed:
            assert state is not None
            return completed_event(state, cost_gpu_hours, now())

        event = await self._append_event(run_id, decide)
        assert isinstance(event, Completed)
        return event

    async def resume(
        self,
        run_id: str,
        *,
        force: bool = False,
        on_skip: Callable[[CorruptSkipped], Awaitable[None]] | None = None,
    ) -> ResumeOutcome:
        """Walk checkpoints newest first: skip (and record) each invalid one, resume from the first valid one."""
        state = await self.run(run_id)
        if state.status == "running" and not force:
            raise Refused(f"run {run_id} is running; resume follows a failure (or use --force)")
        if state.status == "completed":
            raise Refused(f"run {run_id} is completed; nothing may follow completion")
        skipped: list[CorruptSkipped] = []
        while True:
            candidate = next(iter(state.valid_checkpoints()), None)
            if candidate is None:
                return ResumeOutcome(skipped, None, state)
            reason = verify_checkpoint(uri_path(candidate.uri), candidate.checkpoint_hash)
            if reason is None:
                appended = await self._append(run_id, partial(_resume_from, ref=candidate, force=force))
                if appended is not None:
                    assert isinstance(appended.event, Resumed)
                    return ResumeOutcome(skipped, appended.event, await self.model.run(run_id))
            else:
                appended = await self._append(run_id, partial(_skip, ref=candidate, reason=reason))
                if appended is not None:
                    assert isinstance(appended.event, CorruptSkipped)
                    skipped.append(appended.event)
                    _set_aside(uri_path(candidate.uri), appended.event.seq)
                    if on_skip is not None:
                        await on_skip(appended.event)
            state = await self.run(run_id)


def _resume_from(state: RunState | None, ref: CheckpointRef, force: bool) -> Resumed | None:
    """The resumed event, unless another writer changed which checkpoint is newest meanwhile."""
    assert state is not None
    newest = next(iter(state.valid_checkpoints()), None)
    if newest is None or newest.seq != ref.seq:
        return None
    return resumed_event(state, ref, forced=force and state.status == "running")


def _skip(state: RunState | None, ref: CheckpointRef, reason: str) -> CorruptSkipped | None:
    """The corrupt_skipped event, unless another writer already skipped this checkpoint."""
    assert state is not None
    current = state.checkpoint(ref.seq)
    if current is None or current.status != "valid":
        return None
    return CorruptSkipped(
        run_id=state.run_id, checkpoint_seq=ref.seq, step=ref.step, uri=ref.uri, reason=reason
    )


def _set_aside(path: Path, seq: int) -> None:
    """Quarantine a skipped checkpoint; failing to move it never undoes the skip the log recorded."""
    try:
        set_aside(path, "corrupt", str(seq))
    except OSError as exc:
        log.warning("quarantine_failed", path=str(path), error=str(exc))
