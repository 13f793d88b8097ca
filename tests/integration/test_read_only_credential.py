"""`ftrain server credentials --read-only`: a key for auditors and stream consumers that may read the log in
every way ftrain and nats-py read it, and that the embedded server refuses every append and every change to the
stream or its consumers; the writer's key keeps working, and the reader's outlives restarts."""

import asyncio
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import nkeys
import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from ftrain.events.jetstream.nats_server import admits, ensure_server, server_status, stop_server
from ftrain.events.record import STREAM
from tests.support.processes import ftrain_process
from tests.support.servers import last_seq_at

RUN = "dist-P-1x2"
EPHEMERAL_WITH_DURABLE_NAME = 10020
"""JetStream's "consumer expected to be ephemeral but a durable name was set in request"."""
REFUSAL_TIMEOUT_S = 0.5
"""How long a refused request waits: the server answers a denied publish with an -ERR, never a reply."""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The owner's environment: the embedded server under its home (an empty URL reads as unset)."""
    home = tmp_path / "home"
    try:
        yield {"FTRAIN_HOME": str(home), "FTRAIN_STORAGE": str(tmp_path / "ckpt"), "FTRAIN_NATS_URL": ""}
    finally:
        stop_server(home)


def ftrain(env: dict[str, str], *args: str, code: int = 0) -> list[str]:
    done = ftrain_process(list(args), env)
    assert done.returncode == code, f"ftrain {' '.join(args)}: {done.stdout}{done.stderr}"
    return (done.stdout if code == 0 else done.stderr).splitlines()


def issue(writer: dict[str, str], out: Path) -> Path:
    """Issue the reader key through the CLI, a copy at `out`; check what it says and the file's mode."""
    lines = ftrain(writer, "server", "credentials", "--read-only", "--out", str(out))
    assert str(out) in lines[0] and "FTRAIN_NATS_NKEY" in lines[-1]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text().startswith("SU")
    assert out.read_bytes() != (Path(writer["FTRAIN_HOME"]) / "nats" / "user.nk").read_bytes()
    return out


def reader_env(tmp_path: Path, writer: dict[str, str], seed: Path) -> dict[str, str]:
    """An auditor's own home, pointed at the owner's server with the reader key, trusting the owner's key."""
    running = server_status(Path(writer["FTRAIN_HOME"]))
    assert running is not None
    key = ftrain(writer, "keys", "show")[0]
    return {
        "FTRAIN_HOME": str(tmp_path / "auditor"),
        "FTRAIN_STORAGE": str(tmp_path / "auditor-ckpt"),
        "FTRAIN_NATS_URL": running.url,
        "FTRAIN_NATS_NKEY": str(seed),
        "FTRAIN_TRUSTED_KEYS": f"owner={key}",
    }


def test_a_reader_tails_reads_replays_and_audits_but_cannot_append(
    tmp_path: Path, writer: dict[str, str]
) -> None:
    ftrain(writer, "launch", "P", "--nodes", "1", "--gpus-per-node", "2")
    ftrain(writer, "checkpoint", RUN, "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}")
    ftrain(writer, "fail", RUN)
    reader = reader_env(tmp_path, writer, issue(writer, tmp_path / "reader.nk"))

    tail = ftrain(reader, "events", "tail")
    assert [line.split()[5] for line in tail] == ["launched", "checkpointed", "failed"]
    assert all("[ok; signed by owner" in line for line in tail)
    assert len(ftrain(reader, "events", "tail", RUN, "--json")) == 3  # one run's: a last-message get too
    assert json.loads(ftrain(reader, "status", RUN, "--json")[0])["state"] == "failed"
    assert [r["run_id"] for r in json.loads(ftrain(reader, "list", "--json")[0])] == [RUN]
    assert len(json.loads(ftrain(reader, "replay", RUN, "--json")[0])) == 3
    assert ftrain(reader, "audit", "verify")[0].startswith("Verified 3 event(s) in 1 run(s)")

    started = time.monotonic()
    refused = ftrain(reader, "launch", "Q", "--nodes", "1", "--gpus-per-node", "2", code=1)
    assert "permissions violation for publish" in refused[0] and len(refused) == 1
    assert time.monotonic() - started < 10  # refused at once, not retried as an unreachable log
    refused = ftrain(reader, "resume", RUN, code=1)  # the checkpoint reads back; the append is refused
    assert "permissions violation for publish" in refused[0]

    owner = server_status(Path(writer["FTRAIN_HOME"]))
    assert owner is not None
    assert asyncio.run(last_seq_at(owner.url, owner.nkey_file)) == 3  # nothing landed
    ftrain(writer, "resume", RUN)  # the writer's key still appends
    assert asyncio.run(last_seq_at(owner.url, owner.nkey_file)) == 4


async def _plain_client_checks(url: str, writer_seed: str, reader_seed: str) -> list[str]:
    """What a plain nats-py client holding the reader key may do, and the violations the server reports."""
    violations: list[str] = []

    async def seen(exc: Exception) -> None:
        violations.append(str(exc))

    owner = await nats.connect(url, nkeys_seed=writer_seed)
    reader = await nats.connect(url, nkeys_seed=reader_seed, error_cb=seen)
    try:
        wjs, rjs = owner.jetstream(), reader.jetstream(timeout=REFUSAL_TIMEOUT_S)
        await wjs.add_stream(StreamConfig(name=STREAM, subjects=["ftrain.run.>"], allow_direct=True))
        await wjs.publish("ftrain.run.x.launched", b"first")
        await wjs.add_consumer(STREAM, ConsumerConfig(durable_name="dashboard"))

        # reads: stream info, a stored and a last message (direct and not), an ordered consumer, an ephemeral
        # pull consumer (made unnamed, as the server makes only ephemerals there, then bound by its name)
        assert (await rjs.stream_info(STREAM)).state.messages == 1
        assert (await rjs.get_msg(STREAM, 1, direct=True)).data == b"first"
        assert (await rjs.get_last_msg(STREAM, "ftrain.run.x.*")).data == b"first"
        ordered = await rjs.subscribe("ftrain.run.>", ordered_consumer=True)
        assert (await ordered.next_msg(timeout=5)).data == b"first"
        await ordered.unsubscribe()
        made = await rjs.add_consumer(STREAM, ConsumerConfig(filter_subject="ftrain.run.>"))
        pull = await rjs.pull_subscribe_bind(made.name, stream=STREAM)
        [msg] = await pull.fetch(1, timeout=5)
        await msg.ack_sync(timeout=5)
        assert (await rjs.consumer_info(STREAM, "dashboard")).name == "dashboard"
        # never a consumer that outlives the reader (issue 32: the weakest key filled the server's 1000)
        durable = {"stream_name": STREAM, "config": {"durable_name": "mine", "ack_policy": "explicit"}}
        answer = await reader.request(f"$JS.API.CONSUMER.CREATE.{STREAM}", json.dumps(durable).encode())
        assert json.loads(answer.data)["error"]["err_code"] == EPHEMERAL_WITH_DURABLE_NAME
        live = await reader.subscribe("ftrain.run.>")
        await reader.flush()  # the server has the subscription before the owner publishes
        await wjs.publish("ftrain.run.x.failed", b"second")
        assert (await live.next_msg(timeout=5)).data == b"second"

        # every change is refused: appends, and stream and consumer management
        changes = [
            rjs.publish("ftrain.run.x.launched", b"forged"),
            rjs.add_stream(StreamConfig(name="MINE", subjects=["mine.>"])),
            rjs.update_stream(StreamConfig(name=STREAM, subjects=["ftrain.run.>"], max_msgs=1)),
            rjs.purge_stream(STREAM),
            rjs.delete_msg(STREAM, 1),
            rjs.delete_consumer(STREAM, "dashboard"),
            rjs.delete_stream(STREAM),
            rjs.add_consumer(STREAM, ConsumerConfig(durable_name="auditor")),
            rjs.add_consumer(STREAM, ConsumerConfig(name="auditor", durable_name="auditor")),
            rjs.pull_subscribe("ftrain.run.>", durable="auditor", stream=STREAM),
        ]
        for change in changes:
            with pytest.raises(nats.errors.TimeoutError):
                await change
        await reader.publish("ftrain.run.y.completed", b"core publish")  # not even without an ack
        await reader.flush()
        await asyncio.sleep(0.1)

        info = await wjs.stream_info(STREAM)
        assert (info.state.messages, info.config.max_msgs) == (2, -1)
        durables = [c.name for c in await wjs.consumers_info(STREAM) if c.config.durable_name]
        assert durables == ["dashboard"]  # the owner's alone
        assert (await wjs.publish("ftrain.run.x.resumed", b"third")).seq == 3
    finally:
        await reader.close()
        await owner.close()
    return violations


def test_the_server_refuses_the_reader_every_change_and_allows_every_read(
    tmp_path: Path, writer: dict[str, str]
) -> None:
    server = ensure_server(Path(writer["FTRAIN_HOME"]))
    seed = issue(writer, tmp_path / "reader.nk")
    violations = asyncio.run(_plain_client_checks(server.url, server.nkey_file, str(seed)))
    denied = [v.partition('publish to "')[2].rstrip('"') for v in violations]
    assert denied == [
        "ftrain.run.x.launched",
        "$js.api.stream.create.mine",
        "$js.api.stream.update.ftrain_events",
        "$js.api.stream.purge.ftrain_events",
        "$js.api.stream.msg.delete.ftrain_events",
        "$js.api.consumer.delete.ftrain_events.dashboard",
        "$js.api.stream.delete.ftrain_events",
        "$js.api.consumer.durable.create.ftrain_events.auditor",
        "$js.api.consumer.create.ftrain_events.auditor",
        "$js.api.consumer.create.ftrain_events.auditor.ftrain.run.>",
        "ftrain.run.y.completed",
    ], violations  # nats-py lower-cases the server's -ERR lines


def test_issuing_reaches_the_running_server_and_the_key_outlives_restarts(
    tmp_path: Path, writer: dict[str, str]
) -> None:
    home = Path(writer["FTRAIN_HOME"])
    first = ensure_server(home)
    kept = home / "nats" / "reader.nk"
    assert not kept.exists()
    seed = issue(writer, tmp_path / "reader.nk")
    running = server_status(home)
    assert running is not None and running.pid == first.pid  # reloaded (SIGHUP), not restarted
    assert admits(first.port, seed) and admits(first.port, Path(first.nkey_file))
    assert kept.read_bytes() == seed.read_bytes() and stat.S_IMODE(kept.stat().st_mode) == 0o600

    again = issue(writer, tmp_path / "again.nk")  # issuing again hands out the same key
    assert again.read_bytes() == seed.read_bytes()
    assert ftrain(writer, "server", "stop") == ["nats-server stopped"]
    second = ensure_server(home)
    assert second.pid != first.pid and admits(second.port, seed)
    assert admits(second.port, Path(second.nkey_file))
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    assert not admits(second.port, stranger)


def test_bad_requests_are_one_line_exit_2_and_write_nothing(tmp_path: Path, writer: dict[str, str]) -> None:
    kept = Path(writer["FTRAIN_HOME"]) / "nats" / "reader.nk"
    taken = tmp_path / "taken.nk"
    taken.write_text("someone's file\n")
    cases = [
        (writer, ["server", "credentials"], "--read-only"),
        (writer, ["server", "status", "--read-only"], "credentials"),
        (writer, ["server", "start", "--out", str(tmp_path / "x.nk")], "credentials"),
        (writer, ["server", "credentials", "--read-only", "--out", str(tmp_path / "no" / "r.nk")], "no such"),
        (writer, ["server", "credentials", "--read-only", "--out", str(taken)], "exists"),
        ({**writer, "FTRAIN_NATS_URL": "nats://h:1"}, ["server", "credentials", "--read-only"], "URL"),
    ]
    for env, args, said in cases:
        [line] = ftrain(env, *args, code=2)
        assert said in line, line
    assert not kept.exists() and taken.read_text() == "someone's file\n"
    assert not (tmp_path / "x.nk").exists() and not os.path.exists(tmp_path / "no")
