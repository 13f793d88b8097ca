"""The unit tier starts no server: a unit test that asks for one (`server`, and through it `cli`; `weed`,
`moto` or `s3`) fails before any starts, saying where it belongs. Here `env` names no server and `app` is the
service over the in-process event log (tests/support/in_process.py), for tests that need only a log."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftrain.events.memory_log import MemoryStream
from ftrain.service import RunService
from tests.support.in_process import OpenService, in_process_service
from tests.support.servers import user_env

SERVERS = frozenset({"server", "shared_nats", "weed", "moto", "s3"})
"""The fixtures of tests/conftest.py that start a server."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    asked = sorted(SERVERS.intersection(getattr(item, "fixturenames", ())))
    if asked:
        pytest.fail(f"a unit test asks for a server ({', '.join(asked)}): it belongs in tests/integration/")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment a user would set, naming no server; also applied to this process."""
    return user_env(tmp_path, monkeypatch, {})


@pytest.fixture
def stream() -> MemoryStream:
    """The test's in-process stream: `app`'s, and that of every service `another` opens."""
    return MemoryStream()


@pytest.fixture
async def app(env: dict[str, str], stream: MemoryStream) -> AsyncIterator[RunService]:
    """The application service over the test's in-process event log."""
    async with in_process_service(env, stream) as service:
        yield service


@pytest.fixture
def another(env: dict[str, str], stream: MemoryStream) -> OpenService:
    """Opens another service over `app`'s stream, as another process would."""
    return lambda: in_process_service(env, stream)
