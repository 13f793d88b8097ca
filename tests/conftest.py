"""The tiers, and the fixtures they share.

A test's tier is its folder: `tests/unit/` (pure: no server, no process of ftrain's or torchrun's, no sleep),
`tests/integration/` (real nats-server, SQLite, SeaweedFS or moto, files, ftrain CLI processes; no torchrun)
and `tests/e2e/` (torchrun jobs and training processes, network namespaces, the real Slurm, the restart
experiment). Collection marks each test `unit`, `integration` or `e2e` from its folder and fails on a test file
anywhere else; a unit test that asks for a server fails (tests/unit/conftest.py). Helpers live in
`tests/support/`.

The shared fixtures: a real nats-server per test, an environment pointing ftrain at it, the service, and the
CLI run in this process against them. The multi-node tests' cluster (`nodes`) is the e2e tier's
(tests/e2e/conftest.py).
"""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ftrain.events.jetstream.server import ServerProcess, throwaway_server
from ftrain.service import RunService
from tests.support.cli import Cli
from tests.support.servers import login

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")


def tier_of(path: Path) -> str | None:
    """The tier of a test file under tests/: its first folder, when that is a tier's."""
    path = path.resolve()
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


class Misplaced(pytest.File):
    """A test file outside the tiers' folders: collecting it is an error that names it."""

    def collect(self) -> list[pytest.Item]:
        raise self.CollectError(
            f"{self.nodeid}: a test file outside tests/unit/, tests/integration/ and "
            "tests/e2e/; a test's folder is its tier (tests/conftest.py)"
        )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".py" and file_path.name.startswith("test_") and tier_of(file_path) is None:
        return Misplaced.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its folder's tier (`-m unit`, `-m integration`, `-m e2e`)."""
    for item in items:
        if (tier := tier_of(Path(item.path))) is not None:
            item.add_marker(getattr(pytest.mark, tier))


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


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], env: dict[str, str]) -> Cli:
    """`ftrain ARGS` in this process against the test's server (tests/support/cli.py)."""
    return Cli(capsys, env)
