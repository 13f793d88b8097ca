"""The read model heals itself: a file damaged inside ("malformed") or ahead of a stream that went backwards
is set aside or rebuilt from the log, with a warning, and every command keeps working."""

import asyncio
import os
import sqlite3
from pathlib import Path

from ftrain import settings
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.service import RunService
from ftrain.service.run_queries import readmodel_path
from tests.support.builders import launched
from tests.support.processes import ftrain_process

RUNS = 40


def launch_runs(env: dict[str, str]) -> Path:
    """RUNS runs in the log (appended in this process: 40 CLI launches cost 40 s of interpreter start-ups), then
    the read model the CLI builds from them."""

    async def launch_all() -> None:
        async with RunService.open(env) as app:
            for i in range(RUNS):
                await app.launch(launched, lambda i=i: [f"r{i}"])

    asyncio.run(launch_all())
    assert ftrain_process(["list"], env).returncode == 0
    return readmodel_path(settings.nats(env))


def damage_interior_pages(path: Path) -> None:
    """Random bytes over every page but the first (the header stays readable, so open succeeds)."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page:] = os.urandom(len(data) - page)
    path.write_bytes(bytes(data))


def test_malformed_read_model_is_set_aside_and_rebuilt(env: dict[str, str], server: ServerProcess) -> None:
    path = launch_runs(env)
    for command in (["status", "r7"], ["list"], ["replay", "--rebuild"]):
        damage_interior_pages(path)
        result = ftrain_process(command, env)
        assert result.returncode == 0, result.stderr
        assert "readmodel_unreadable" in result.stdout + result.stderr
    listed = ftrain_process(["list"], env)
    assert len(listed.stdout.splitlines()) == RUNS + 1
    assert list(path.parent.glob(f"{path.name}.unreadable-*"))


def test_a_model_ahead_of_the_stream_is_rebuilt(env: dict[str, str], server: ServerProcess) -> None:
    path = launch_runs(env)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '999' WHERE key = 'last_seq'")
        db.execute("DELETE FROM runs WHERE run_id = 'r3'")
    result = ftrain_process(["status", "r3"], env)
    assert result.returncode == 0, result.stderr
    assert "readmodel_ahead_of_stream" in result.stdout + result.stderr


def test_a_model_that_disagrees_with_the_stream_at_its_last_sequence_is_rebuilt(
    env: dict[str, str], server: ServerProcess
) -> None:
    """A store restored from an older copy and appended to anew reaches the model's last sequence with other
    events: the model would think itself caught up while holding runs the log no longer has."""
    path = launch_runs(env)
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE audit SET hash = ? WHERE stream_seq = (SELECT MAX(stream_seq) FROM audit)", ("f" * 64,)
        )
        db.execute("DELETE FROM runs WHERE run_id = 'r3'")
    result = ftrain_process(["status", "r3"], env)
    assert result.returncode == 0, result.stderr
    assert "readmodel_diverged_from_stream" in result.stdout + result.stderr
    again = ftrain_process(["status", "r3"], env)
    assert again.returncode == 0 and "readmodel_diverged_from_stream" not in again.stdout + again.stderr
