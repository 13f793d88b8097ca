"""The tiers, and the fixtures they share.

A test's tier is its folder: `tests/unit/` (pure: no server, no process of ftrain's or torchrun's, no sleep),
`tests/integration/` (real nats-server, SQLite, SeaweedFS or moto, files, ftrain CLI processes; no torchrun)
and `tests/e2e/` (torchrun jobs and training processes, network namespaces, the real Slurm, the restart
experiment). Collection marks each test `unit`, `integration` or `e2e` from its folder and fails on a test file
anywhere else; a unit test that asks for a server fails (tests/unit/conftest.py). Helpers live in
`tests/support/`.

The shared fixtures: a real nats-server for the session (one per xdist worker) with a fresh account for each
test (`server`; tests/support/shared_nats.py), or a server of its own for a test marked `own_server` (it
kills, restarts or pauses its server, or reads its files), an environment pointing ftrain at it, the service,
and the CLI run in this process against them; one SeaweedFS and one moto server for the session (`weed`,
`moto`, and `s3`: each in turn), on which each test makes its own bucket. The multi-node tests' cluster
(`nodes`) is the e2e tier's (tests/e2e/conftest.py).
"""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ftrain.events.jetstream.nats_server import ServerProcess, throwaway_server
from ftrain.service import RunService
from tests.support.cli import Cli
from tests.support.s3 import S3_KINDS, Endpoint, moto_server, seaweedfs
from tests.support.servers import login, user_env
from tests.support.shared_nats import SharedServer

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


@pytest.fixture(scope="session")
def shared_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServer]:
    """The session's nats-server (this xdist worker's)."""
    shared = SharedServer(tmp_path_factory.mktemp("shared-nats"))
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh account on the session's nats-server: to the test, an empty JetStream server of its own. A test
    marked `own_server` (it kills, restarts or pauses its server, or reads its files) gets a server of its own
    on a free 127.0.0.1 port, its store under the test's temp dir."""
    if request.node.get_closest_marker("own_server") is None:
        shared: SharedServer = request.getfixturevalue("shared_nats")
        yield shared.account(tmp_path / "server")
        return
    with throwaway_server(tmp_path / "server") as proc:
        yield proc


@pytest.fixture(scope="session")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """The session's SeaweedFS (this xdist worker's): a test makes its own bucket (`Endpoint.new_bucket`); one
    that kills or restarts its store starts its own (`throwaway_storage_server`)."""
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as found:
        yield found


@pytest.fixture(scope="session")
def moto() -> Iterator[Endpoint]:
    """The session's moto server (this xdist worker's): a test makes its own bucket."""
    with moto_server() as found:
        yield found


@pytest.fixture(params=list(S3_KINDS))
def s3(request: pytest.FixtureRequest) -> Endpoint:
    """Each S3 implementation in turn, for the suites that hold ftrain's S3 backend to both: the session's
    SeaweedFS (the default users get) and its moto server."""
    found: Endpoint = request.getfixturevalue(S3_KINDS[request.param])
    return found


@pytest.fixture
def env(tmp_path: Path, server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment a user would set to point ftrain at `server`; also applied to this process."""
    return user_env(tmp_path, monkeypatch, login(server))


@pytest.fixture
async def app(env: dict[str, str]) -> AsyncIterator[RunService]:
    """The application service, connected to the test's server."""
    async with RunService.open(env) as service:
        yield service


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], env: dict[str, str]) -> Cli:
    """`ftrain ARGS` in this process against the test's server (tests/support/cli.py)."""
    return Cli(capsys, env)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The random order's seed, under `-q` too (pytest-randomly prints it only in the header)."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(f"tests in random order: --randomly-seed={seed} replays it")
