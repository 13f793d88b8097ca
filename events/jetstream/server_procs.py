"""The nats-server processes on this machine: is a pid alive, is it our nats-server, does it answer, make it stop.

Servers started by this process are kept as children so their exit is reaped (no zombies) and observed; any
other pid is looked at through /proc, checking its command line so a reused pid is never taken for ours.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import msgspec
import structlog

BINARY: Final = "nats-server"
HOST: Final = "127.0.0.1"
POLL: Final = 0.01
PROBE_TIMEOUT: Final = 2.0

log = structlog.get_logger(__name__)

_children: dict[int, subprocess.Popen[bytes]] = {}


class _Info(msgspec.Struct):
    """The fields we read from the server's greeting ``INFO {...}`` line."""

    jetstream: bool = False
    server_name: str = ""
    auth_required: bool = False


def adopt(child: subprocess.Popen[bytes]) -> None:
    """Keep a server this process started, so that waiting for it reaps it."""
    _children[child.pid] = child


def pid_alive(pid: int) -> bool:
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
    if not argv or BINARY not in os.path.basename(argv[0].decode(errors="replace")):
        return False
    return conf is None or str(conf).encode() in argv


def server_alive(pid: int, conf: Path | None) -> bool:
    """`pid` is a live nats-server (started with `conf`, when given)."""
    return pid_alive(pid) and _is_our_nats(pid, conf)


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait for ``pid`` to exit (reaping it if it is our child); True if it did."""
    deadline = time.monotonic() + timeout
    child = _children.get(pid)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, timeout))
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


def send_signal(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    """Signal the process (or its group); one already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM (nats-server shuts down cleanly, flushing), then SIGKILL if it hangs."""
    send_signal(pid, signal.SIGTERM)
    if not wait_gone(pid, timeout):
        log.warning("nats_server.kill_after_timeout", pid=pid, timeout=timeout)
        send_signal(pid, signal.SIGKILL)
        wait_gone(pid, 5.0)


def _probe_info(port: int, host: str, timeout: float) -> _Info | None:
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


def js_ready(port: int, timeout: float = PROBE_TIMEOUT, *, auth: bool = False) -> bool:
    """A NATS server with JetStream answers on ``port`` (read from its greeting: no nats-py needed); with
    `auth`, one that also requires clients to sign in (an older ftrain's open server does not)."""
    info = _probe_info(port, HOST, timeout)
    return info is not None and info.jetstream and (info.auth_required or not auth)
