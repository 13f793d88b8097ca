"""The application service over the in-process event log (`events.memory_log`), for unit tests of what
needs only a log: the keys, trust list, anchors, read model and checkpoint storage a user's
`RunService.open` takes from the environment, with the stream held in memory instead of a nats-server."""

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from ftrain import settings
from ftrain.events.jetstream.connection import log_writer
from ftrain.events.memory_log import InProcessLog, MemoryStream
from ftrain.projections.projector import Projector
from ftrain.projections.readmodel import ReadModel
from ftrain.service import RunService
from ftrain.service.run_commands import checkpoint_storage
from ftrain.service.run_queries import readmodel_path

OpenService = Callable[[], AbstractAsyncContextManager[RunService]]
"""Opens another service over one stream, as another process's `RunService.open(env)` would."""


@asynccontextmanager
async def in_process_service(
    env: Mapping[str, str], stream: MemoryStream | None = None
) -> AsyncIterator[RunService]:
    """A service over `stream` (a new one by default), as `RunService.open` opens one over the server."""
    nats = settings.nats(env)
    with log_writer(nats) as writer:
        log = InProcessLog(stream, **writer._asdict())
        stream_id = await log.ensure_stream()
        model = await ReadModel.open(readmodel_path(nats))
        try:
            yield RunService(log, model, Projector(log, model, stream_id), checkpoint_storage(env))
        finally:
            await model.close()
