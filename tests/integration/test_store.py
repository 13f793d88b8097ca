"""The JetStream event store against a real nats-server, in what only it does: its stream config, heads with
their Nats-Msg-Id, deduplicated retries, direct-get headers, retries while unavailable (what every event log
does: tests/integration/test_log_conformance.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftrain.events.chain import GENESIS, ChainHead
from ftrain.events.jetstream.nats_client import Nats
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.jetstream.store import EventStore
from ftrain.events.record import STREAM
from tests.support.builders import checkpointed, launched
from tests.support.processes import free_port
from tests.support.servers import start_configured_server


@pytest.fixture
async def store(server: ServerProcess) -> EventStore:
    nc = Nats()
    await nc.connect(server.url, nkeys_seed=server.nkey_file)
    event_store = EventStore(nc)
    await event_store.ensure_stream()
    yield event_store
    await nc.close()


async def test_stream_is_file_backed_append_only_and_deduplicating(store: EventStore) -> None:
    info = await store._js.stream_info(STREAM)
    config = info.config
    assert config.subjects == ["ftrain.run.>"]
    assert (config.deny_delete, config.deny_purge, config.duplicate_window) == (True, True, 120.0)
    assert config.storage == "file"
    assert await store.ensure_stream() == str(info.created)  # idempotent, same identity


async def test_append_stamps_and_chains_and_head_reads_it_back(store: EventStore) -> None:
    first = await store.append(launched("r1"), ChainHead())
    assert (first.event.seq, first.event.prev_hash, first.stream_seq) == (1, GENESIS, 1)
    assert first.event.actor is not None and first.event.id and first.event.time.year >= 2026
    second = await store.append(checkpointed("r1", 10), first.head)
    assert (second.event.seq, second.event.prev_hash) == (2, first.hash)
    found = await store.head("r1")
    assert found == (second.head, second.event.id)
    assert await store.head("nobody") is None


async def test_retry_of_a_landed_publish_returns_the_original(store: EventStore) -> None:
    head = (await store.append(launched("r1"), ChainHead())).head
    first = await store.append(checkpointed("r1", 10), head)
    # the same event (same id) retried with the same, now stale, expected head: 10071, but it is ours
    again = await store.append(first.event, head)
    assert (again.stream_seq, again.hash) == (first.stream_seq, first.hash)
    assert await store.last_seq() == 2


async def test_stored_headers_cannot_impersonate_the_servers(store: EventStore) -> None:
    head = (await store.append(launched("r1"), ChainHead())).head
    spoof = {"Nats-Subject": "ftrain.run.r1.checkpointed", "Nats-Sequence": "1"}
    await store._js.publish("ftrain.run.intruder.failed", b'{"type":"failed"}', headers=spoof)
    await store.append(checkpointed("r1", 10), head)
    records = [r async for b in store.read(1) for r in b]
    assert [(r.stream_seq, r.run_id, r.event_type) for r in records] == [
        (1, "r1", "launched"),
        (2, "intruder", "failed"),
        (3, "r1", "checkpointed"),
    ]


RETRY_UNTIL_UNAVAILABLE = """
import asyncio, sys
from ftrain.events.jetstream.nats_client import Nats
from ftrain.events.jetstream.store import EventStore
from ftrain.events.log_port import LogUnavailable
from ftrain.logs import configure

async def main() -> None:
    configure()
    nc = Nats()
    await nc.connect(sys.argv[1])
    try:
        await EventStore(nc, deadline=0.5).ensure_stream()
    except LogUnavailable as exc:
        print(exc)
    finally:
        await nc.close()

asyncio.run(main())
"""


@pytest.mark.parametrize(("level", "retry_lines"), [(None, False), ("info", True)])
def test_retries_are_quiet_unless_the_log_level_asks(
    tmp_path: Path, level: str | None, retry_lines: bool
) -> None:
    # a server without JetStream: every stream request goes unanswered, retried until the deadline
    port = free_port()
    proc = start_configured_server(tmp_path, f"listen: 127.0.0.1:{port}\n", port)
    env = {k: v for k, v in os.environ.items() if k != "FTRAIN_LOG_LEVEL"} | (
        {"FTRAIN_LOG_LEVEL": level} if level else {}
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", RETRY_UNTIL_UNAVAILABLE, f"nats://127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        proc.kill()
        proc.wait()
    assert done.stdout.startswith("event log unreachable (stream info: "), done.stdout + done.stderr
    assert ("log_retry" in done.stderr) == retry_lines, done.stderr
    if not retry_lines:
        assert done.stderr == ""
