"""The nats-server processes on this machine: is a pid our nats-server, does it answer.

What every server ftrain runs shares (starting, reaping, telling a reused pid apart) is `ftrain.host.processes`;
this is what is nats-server's own: its binary's name and its greeting.
"""

import socket
from pathlib import Path
from typing import Final

import msgspec

from ftrain.host.processes import HOST, runs

BINARY: Final = "nats-server"
PROBE_TIMEOUT: Final = 2.0


class _Info(msgspec.Struct):
    """The fields we read from the server's greeting ``INFO {...}`` line."""

    jetstream: bool = False
    server_name: str = ""
    auth_required: bool = False


def server_alive(pid: int, conf: Path | None) -> bool:
    """`pid` is a live nats-server (started with `conf`, when given)."""
    return runs(pid, BINARY, None if conf is None else str(conf))


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
