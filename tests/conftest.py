"""Shared fixtures: a real nats-server per test, an environment pointing ftrain at it, and the service."""

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from events.nats_server import ServerProcess, throwaway_server
from events.store import STREAM
from ftrain.service import Ftrain


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
        "FTRAIN_NATS_URL": server.url,
        "FTRAIN_STORAGE": str(tmp_path / "ckpt"),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    monkeypatch.delenv("PBS_NODEFILE", raising=False)
    return values


@pytest.fixture
async def app(env: dict[str, str]) -> AsyncIterator[Ftrain]:
    """The application service, connected to the test's server."""
    async with Ftrain.open(env) as service:
        yield service


async def stream_last_seq(url: str) -> int:
    """The stream's last sequence, read with a plain client (0 when the stream does not exist yet)."""
    nc = await nats.connect(url)
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
