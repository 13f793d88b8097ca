"""`ftrain server start|stop|status`: manage the embedded nats-server under $FTRAIN_HOME."""

from collections.abc import Mapping

from events.jetstream.server import NatsServerError, ensure_server, server_status, stop_server
from ftrain import settings
from ftrain.cli.render import emit
from ftrain.errors import Refused, UsageError


def server_command(action: str, env: Mapping[str, str]) -> int:
    """Run one server action; the embedded server only exists when FTRAIN_NATS_URL is unset."""
    nats = settings.nats(env)
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
