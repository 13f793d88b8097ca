"""Test helpers for the embedded server: crash it and bring it back on the same store and port."""

import signal
from pathlib import Path

import structlog

from ftrain.events.jetstream.server import NatsServerError, ServerProcess, start_server
from ftrain.events.jetstream.server_procs import send_signal, server_alive, wait_gone

log = structlog.get_logger(__name__)


def kill_server(proc: ServerProcess) -> None:
    """SIGKILL (a crash: no shutdown, no flush) and wait until the process is gone."""
    if not server_alive(proc.pid, None):
        return
    send_signal(proc.pid, signal.SIGKILL)
    if not wait_gone(proc.pid, 10.0):
        raise NatsServerError(f"nats-server pid {proc.pid} survived SIGKILL")
    log.info("nats_server.killed", pid=proc.pid, port=proc.port, store=proc.store_dir)


def restart_server(proc: ServerProcess) -> ServerProcess:
    """Start again on the same store dir and port (killing the old one first if still alive)."""
    kill_server(proc)
    home = Path(proc.store_dir).parent.parent  # store_dir is <home>/nats/store
    new = start_server(home, port=proc.port)
    if new.store_dir != proc.store_dir:
        raise NatsServerError(f"restarted on {new.store_dir}, expected {proc.store_dir}")
    return new
