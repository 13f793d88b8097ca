"""The queries: what `status`, `list`, `cost`, `audit` and `replay` read.

The views read the SQLite read model, caught up with the log first (read-your-writes) and healed when its
file is damaged; audit, replay and goodput walk the stream itself. Nothing here appends.
"""

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from ftrain.auditor import AuditReport, TimelineEntry, timeline, verify
from ftrain.domain.chain_walk import Finding
from ftrain.domain.lifecycle import RunState
from ftrain.domain.vouching import Unvouched, Vouched
from ftrain.errors import NotFound, Refused, UsageError
from ftrain.events.jetstream.connection import NatsSettings, endpoint_name
from ftrain.events.jetstream.lease import LeaseStore, LeaseView
from ftrain.events.log_port import EventLog
from ftrain.events.run_id import InvalidRunId, validate_run_id
from ftrain.events.schema import now
from ftrain.projections.goodput import Goodput, measure
from ftrain.projections.projector import Projector
from ftrain.projections.readmodel import ReadModel, StoredRun, damaged

T = TypeVar("T")


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


def readmodel_path(settings: NatsSettings) -> Path:
    """One read model per log endpoint, under $FTRAIN_HOME."""
    return settings.home / endpoint_name(settings, "readmodel", ".sqlite")


class RunQueries:
    """The queries over one event store and its read model."""

    def __init__(
        self, store: EventLog, model: ReadModel, projector: Projector, leases: LeaseStore | None = None
    ) -> None:
        self.store = store
        self.model = model
        self.projector = projector
        self.leases = leases
        """The supervisor leases (None: opened without them; every lease query and command refuses)."""

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

    async def lease(self, run_id: str) -> LeaseView:
        """The run's supervisor lease as the bucket's leader has it. Raises LogUnavailable."""
        if self.leases is None:
            raise RuntimeError("RunService opened without leases")
        return await self.leases.read(run_id)
