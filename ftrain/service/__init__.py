"""The application service: commands become events on a run's own log (`run_commands`), queries read the
caught-up read model or the stream (`run_queries`). `RunService` is both over one connection: the CLI is a
thin shell over it, and tests call it directly."""

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

from ftrain import settings as ftrain_settings
from ftrain.errors import UsageError
from ftrain.events.jetstream.connection import open_store
from ftrain.events.jetstream.lease import LeaseStore, open_leases
from ftrain.events.log_port import EventLog, LogTampered
from ftrain.projections.projector import Projector
from ftrain.projections.readmodel import ReadModel
from ftrain.service.run_commands import RunCommands, checkpoint_storage
from ftrain.service.run_queries import RunQueries, readmodel_path


class RunService(RunCommands, RunQueries):
    """Commands and queries over one event store, one read model and one checkpoint storage root."""

    def __init__(
        self,
        store: EventLog,
        model: ReadModel,
        projector: Projector,
        storage: str,
        leases: LeaseStore | None = None,
    ) -> None:
        RunCommands.__init__(self, store, storage, leases)
        RunQueries.__init__(self, store, model, projector, leases)

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
