"""Shared fixtures: a real nats-server per test, an environment pointing ftrain at it, and the service; and the
multi-node tests' cluster of network-namespace nodes (`nodes`, one per session)."""

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import nats
import pytest

from ftrain.events.jetstream.server import ServerProcess, throwaway_server
from ftrain.events.record import STREAM
from ftrain.service import RunService
from tests.netns import nodes as nodes


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh JetStream server on a free 127.0.0.1 port, store under the test's temp dir."""
    with throwaway_server(tmp_path / "server") as proc:
        yield proc


@pytest.fixture
def env(tmp_path: Path, server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment a user would set to point ftrain at `server`; also applied to this process."""
    values = {
        "FTRAIN_HOME": str(tmp_path / "home"),
        **login(server),
        "FTRAIN_STORAGE": str(tmp_path / "ckpt"),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    monkeypatch.delenv("PBS_NODEFILE", raising=False)
    return values


@pytest.fixture
async def app(env: dict[str, str]) -> AsyncIterator[RunService]:
    """The application service, connected to the test's server."""
    async with RunService.open(env) as service:
        yield service


def login(server: ServerProcess) -> dict[str, str]:
    """The settings a user sets to reach `server`: its URL and the nkey seed file it admits."""
    return {"FTRAIN_NATS_URL": server.url, "FTRAIN_NATS_NKEY": server.nkey_file}


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


def ftrain_process(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real `ftrain` console script."""
    script = Path(sys.executable).with_name("ftrain")
    return subprocess.run(
        [str(script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def modules_imported_by(modules: Iterable[str]) -> set[str]:
    """Every module a fresh interpreter holds after importing `modules`: what a layering test asserts on."""
    code = "import importlib, json, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\nprint(json.dumps([*sys.modules]))"
    result = subprocess.run(
        [sys.executable, "-c", code, *modules], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_configured_server(directory: Path, config: str, port: int) -> subprocess.Popen[bytes]:
    """A nats-server with a hand-written config (auth, TLS, cluster); returns once its client port accepts."""
    import socket
    import time

    from ftrain.events.jetstream.server import nats_server_binary

    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "server.conf"
    conf.write_text(config)
    log = open(directory / "server.log", "wb")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen([str(nats_server_binary()), "-c", str(conf)], stdout=log, stderr=log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"nats-server did not start: {(directory / 'server.log').read_text()[-2000:]}")
