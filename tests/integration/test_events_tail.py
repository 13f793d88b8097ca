"""`ftrain events tail`: every stored event with its chain and its own signature verdict, through the real
CLI; forgeries are published behind ftrain's back with a plain nats client."""

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ftrain.events.chain import seal
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.schema import Checkpointed, decode_event, encode_event, now
from ftrain.events.signing import Signer
from tests.integration.test_failures import MALLORY, raw_publish
from tests.support.builders import SIGNER
from tests.support.processes import ftrain_process

RUN = "tail-run"
WAIT_S = 30.0


def ok(env: dict[str, str], *args: str) -> list[str]:
    result = ftrain_process(list(args), env)
    assert (result.returncode, result.stderr) == (0, ""), f"ftrain {' '.join(args)}: {result.stderr}"
    return result.stdout.splitlines()


def launch(env: dict[str, str], run_id: str) -> None:
    ok(
        env,
        "launch",
        "p",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--nodelist",
        "localhost",
        "--run-id",
        run_id,
    )


def launched_and_checkpointed(env: dict[str, str]) -> None:
    launch(env, RUN)
    ok(env, "checkpoint", RUN, "--step", "10", "--epoch", "1", "--shards", "1", "--state", '{"step": 10}')


def tail_json(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ok(env, "events", "tail", *args, "--json")]


def next_checkpoint(last: dict[str, Any], step: int, signer: Signer | None) -> bytes:
    """The checkpointed event after `last` (a `--json` line), correctly chained, written by Mallory."""
    template = decode_event(msgspec.json.encode(last["event"]))
    assert isinstance(template, Checkpointed)
    event = msgspec.structs.replace(
        template, seq=template.seq + 1, prev_hash=last["hash"], id=uuid.uuid4().hex, time=now(), actor=MALLORY,
        step=step,
    )  # fmt: skip
    return seal(encode_event(event), last["hash"], signer.sign_hash if signer else None)[0]


def test_the_backlog_shows_each_event_chained_and_signed_by_its_writer(env: dict[str, str]) -> None:
    launched_and_checkpointed(env)
    lines = ok(env, "events", "tail", RUN)
    assert [line.split()[5] for line in lines] == ["launched", "checkpointed"]
    assert all(line.endswith(f"[ok; signed by {SIGNER}]") for line in lines), lines
    assert "step 10 epoch 1" in lines[1]


def test_forgeries_show_unsigned_untrusted_and_bad_signatures(
    env: dict[str, str], server: ServerProcess
) -> None:
    launched_and_checkpointed(env)
    mallory = Signer(Ed25519PrivateKey.generate())
    asyncio.run(
        raw_publish(
            server, f"ftrain.run.{RUN}.checkpointed", next_checkpoint(tail_json(env, RUN)[-1], 20, None)
        )
    )
    signed = next_checkpoint(tail_json(env, RUN)[-1], 30, mallory)
    asyncio.run(raw_publish(server, f"ftrain.run.{RUN}.checkpointed", signed))
    forged_sig = mallory.sign_hash("0" * 64).sig.encode()
    bad = next_checkpoint(tail_json(env, RUN)[-1], 40, mallory)
    asyncio.run(
        raw_publish(
            server, f"ftrain.run.{RUN}.checkpointed", bad[: -len(forged_sig) - 2] + forged_sig + b'"}'
        )
    )

    verdicts = [line[line.rindex("[") :] for line in ok(env, "events", "tail", RUN)]
    untrusted = f"signed by untrusted key ed25519:{mallory.public_key[:16]}…"
    assert verdicts == [
        f"[ok; signed by {SIGNER}]",
        f"[ok; signed by {SIGNER}]",
        "[ok; unsigned]",
        f"[ok; {untrusted}]",
        "[ok; bad signature]",
    ]
    docs = tail_json(env)
    assert [(d["chain"], d["signer"], d["signer_name"], d["signature"]) for d in docs[2:]] == [
        ("ok", None, None, "unsigned"),
        ("ok", mallory.public_key, None, untrusted),
        ("ok", mallory.public_key, None, "bad signature"),
    ]
    assert docs[0]["signer_name"] == SIGNER and docs[0]["signature"] == f"signed by {SIGNER}"
    assert [d["event"]["step"] for d in docs[1:]] == [10, 20, 30, 40]
    assert [d["stream_seq"] for d in docs] == [1, 2, 3, 4, 5]
    assert all(d["event"]["prev_hash"] == prev["hash"] for prev, d in pairwise(docs))


def test_a_broken_link_is_reported_not_refused(env: dict[str, str], server: ServerProcess) -> None:
    launched_and_checkpointed(env)
    first = tail_json(env, RUN)[0]
    forged = next_checkpoint({**tail_json(env, RUN)[-1], "hash": first["hash"]}, 20, None)
    asyncio.run(raw_publish(server, f"ftrain.run.{RUN}.checkpointed", forged))
    last = tail_json(env, RUN)[-1]
    assert last["chain"].startswith("prev_hash ") and last["event"]["step"] == 20
    assert ok(env, "events", "tail", RUN)[-1].endswith("does not match the hash of seq 2; unsigned]")


def test_an_unknown_run_is_not_found_exit_1(env: dict[str, str]) -> None:
    launch(env, RUN)
    result = ftrain_process(["events", "tail", "no-such-run"], env)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "ftrain events: unknown run 'no-such-run'\n"


class Follower:
    """`ftrain events tail --follow` as a child process, its lines read as they come."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        script = Path(sys.executable).with_name("ftrain")
        self.proc = subprocess.Popen(
            [str(script), "events", "tail", "--follow", *args],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def next_line(self) -> str:
        return self.lines.get(timeout=WAIT_S)

    def stop(self, signum: int) -> tuple[int, str]:
        self.proc.send_signal(signum)
        _, err = self.proc.communicate(timeout=WAIT_S)
        return self.proc.returncode, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_follow_waits_for_a_run_prints_what_lands_and_stops_cleanly(env: dict[str, str], signum: int) -> None:
    launch(env, "other-run")
    follower = Follower(env, RUN)
    try:
        launched_and_checkpointed(env)
        assert " launched " in follower.next_line()
        assert " checkpointed " in follower.next_line()
        ok(env, "fail", RUN, "--reason", "preempted")
        appended = follower.next_line()
        assert " failed " in appended and appended.endswith(f"[ok; signed by {SIGNER}]")
        assert follower.lines.empty()
        assert follower.stop(signum) == (0, "")
    finally:
        follower.proc.kill()
