"""One nats-server for a test session (one per xdist worker) and a fresh account on it for each test.

A nats-server account is a namespace of its own: its subjects, JetStream streams, KV buckets and consumers are
invisible to every other account. A test signed in to a fresh account therefore meets an empty server, as if it
had started one, for a config reload (about 5 ms here) instead of a start and a stop (about 35 ms). The config
holds the current test's account alone, so the reload also ends any connection an earlier test left open.

The server is configured as ftrain's embedded one is where a test can tell (nkey sign-in, the pinned
max_payload, every write fsynced before its ack). A test that kills, restarts or pauses its server, or reads its
files, cannot share one: it asks for its own (`own_server` in tests/conftest.py); `kill_server` refuses a shared
one.
"""

import json
import signal
import time
import uuid
from pathlib import Path

from ftrain.events.jetstream.nats_server import ServerProcess, admits
from ftrain.events.jetstream.server_files import seed_path, user_key
from tests.support.processes import free_port
from tests.support.servers import SHARED_PIDS, start_configured_server

RELOAD_TIMEOUT = 10.0


class SharedServer:
    """A nats-server under `directory` whose one account is replaced for each test (`account`)."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        directory.mkdir(parents=True, exist_ok=True)
        self.store = directory / "store"
        self.proc = start_configured_server(directory, self._config("first", user_key(directory)), self.port)
        SHARED_PIDS.add(self.proc.pid)
        self._wait_admitted(seed_path(directory))
        self.started_at = time.time()

    def _config(self, account: str, user: str) -> str:
        q = json.dumps
        return "\n".join(
            [
                f"listen: {q(f'127.0.0.1:{self.port}')}",
                "max_payload: 1048576",
                f"jetstream {{ store_dir: {q(str(self.store))}, sync_interval: always }}",
                f"accounts {{ {q(account)}: {{ jetstream: enabled, users: [ {{ nkey: {q(user)} }} ] }} }}",
                "",
            ]
        )

    def _wait_admitted(self, seed_file: Path) -> None:
        deadline = time.monotonic() + RELOAD_TIMEOUT
        while not admits(self.port, seed_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.directory / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the shared nats-server did not admit {seed_file}: {log}")
            time.sleep(0.002)

    def account(self, seed_dir: Path) -> ServerProcess:
        """A fresh account, its user's seed in `seed_dir/user.nk`; the previous test's account is gone."""
        seed_dir.mkdir(parents=True, exist_ok=True)
        config = self._config(f"test-{uuid.uuid4().hex[:12]}", user_key(seed_dir))  # a new seed, 0600
        seed_file = seed_path(seed_dir)
        (self.directory / "server.conf").write_text(config)
        self.proc.send_signal(signal.SIGHUP)
        self._wait_admitted(seed_file)
        return ServerProcess(
            pid=self.proc.pid,
            port=self.port,
            url=f"nats://127.0.0.1:{self.port}",
            store_dir=str(self.store),
            started_at=self.started_at,
            nkey_file=str(seed_file),
        )

    def close(self) -> None:
        SHARED_PIDS.discard(self.proc.pid)
        self.proc.kill()
        self.proc.wait()
