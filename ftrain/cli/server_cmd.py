"""`ftrain server start|stop|status|repair`: manage the embedded nats-server under $FTRAIN_HOME, and accept,
on record, a stream that is no longer the one anchored."""

import asyncio
from collections.abc import Mapping

from events.jetstream.connection import NatsSettings, open_store
from events.jetstream.server import NatsServerError, ensure_server, server_status, stop_server
from ftrain import settings
from ftrain.cli.render import emit
from ftrain.errors import Refused, UsageError


def server_command(action: str, env: Mapping[str, str]) -> int:
    """Run one server action; the embedded server only exists when FTRAIN_NATS_URL is unset."""
    nats = settings.nats(env)
    if action == "repair":
        return asyncio.run(_repair(nats))
    if nats.url is not None:
        raise UsageError(f"{settings.NATS_URL} is set: ftrain does not manage that server")
    home = nats.home
    try:
        if action == "start":
            proc = ensure_server(home)
            emit(f"nats-server running at {proc.url} (pid {proc.pid}, store {proc.store_dir})")
        elif action == "stop":
            emit("nats-server stopped" if stop_server(home) else "nats-server was not running")
        else:
            running = server_status(home)
            if running is None:
                emit(f"nats-server not running (home {home})")
                return 3
            emit(f"nats-server running at {running.url} (pid {running.pid}, store {running.store_dir})")
    except NatsServerError as exc:
        raise Refused(str(exc)) from exc
    return 0


async def _repair(nats: NatsSettings) -> int:
    """Re-create a vanished stream, restore ftrain's retention settings, and anchor the stream as it is,
    with what differed: later opens accept it, and `audit verify` lists it as accepted."""
    async with open_store(nats) as store:
        change, facts = await store.repair()
    emit(f"stream {facts.stream} (created {facts.created}, last seq {facts.last_seq}) accepted and anchored")
    emit(f"what differed: {change}" if change else "nothing differed from the newest anchor")
    return 0
