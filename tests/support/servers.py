"""Test helpers for nats-servers: the settings that reach one, a plain client signed in to it, its stream's
last sequence, a server with a hand-written config, and the embedded server crashed and brought back on the
same store and port."""

import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import nats
import pytest
import structlog

from ftrain.events.jetstream.nats_server import (
    NatsServerError,
    ServerProcess,
    nats_server_binary,
    start_server,
)
from ftrain.events.jetstream.server_procs import server_alive
from ftrain.events.record import STREAM
from ftrain.host.processes import send_signal, wait_gone

log = structlog.get_logger(__name__)

SHARED_PIDS: set[int] = set()
"""The pids of the session's shared servers (tests/support/shared_nats.py), which no test may kill."""


def login(server: ServerProcess) -> dict[str, str]:
    """The settings a user sets to reach `server`: its URL and the nkey seed file it admits."""
    return {"FTRAIN_NATS_URL": server.url, "FTRAIN_NATS_NKEY": server.nkey_file}


def user_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_login: Mapping[str, str]
) -> dict[str, str]:
    """The environment a user would set, `server_login` naming the log's server; also applied to this process,
    outside any scheduler's allocation."""
    values = {
        "FTRAIN_HOME": str(tmp_path / "home"),
        **server_login,
        "FTRAIN_STORAGE": str(tmp_path / "ckpt"),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE"):
        monkeypatch.delenv(name, raising=False)
    return values


async def plain_connect(url: str, nkey: str) -> nats.NATS:
    """A plain nats-py client (no ftrain code) signed in with the nkey seed file `nkey`."""
    return await nats.connect(url, nkeys_seed=nkey)


async def stream_last_seq(server: ServerProcess) -> int:
    """The stream's last sequence, read with a plain client (0 when the stream does not exist yet)."""
    return await last_seq_at(server.url, server.nkey_file)


async def last_seq_at(url: str, nkey: str) -> int:
    """`stream_last_seq` of the server at `url`, signed in with the seed file `nkey`."""
    nc = await plain_connect(url, nkey)
    try:
        info = await nc.jetstream().stream_info(STREAM)
        return int(info.state.last_seq)
    except nats.js.errors.NotFoundError:
        return 0
    finally:
        await nc.close()


def start_configured_server(directory: Path, config: str, port: int) -> subprocess.Popen[bytes]:
    """A nats-server with a hand-written config (auth, TLS, cluster); returns once its client port accepts."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "server.conf"
    conf.write_text(config)
    server_log = open(directory / "server.log", "wb")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen(
        [str(nats_server_binary()), "-c", str(conf)], stdout=server_log, stderr=server_log
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"nats-server did not start: {(directory / 'server.log').read_text()[-2000:]}")


def kill_server(proc: ServerProcess) -> None:
    """SIGKILL (a crash: no shutdown, no flush) and wait until the process is gone."""
    if proc.pid in SHARED_PIDS:
        raise AssertionError(
            "this test's server is the session's shared one: a test that kills it asks for its own"
        )
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
