"""Failure is the product's subject: forged events, a crashed broker, a missing broker, racing writers and
retried publishes, all against a real nats-server, a real SQLite read model and real checkpoint files.

Every test asserts on what survived: the stream's exact contents, the read model's state, the CLI's exit
code and its one-line messages, and the checkpoint directories left on disk.
"""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.js.errors import BadRequestError

from ftrain import settings
from ftrain.errors import Refused
from ftrain.events.chain import ChainHead, link_hash, seal, unseal
from ftrain.events.jetstream.connection import open_store
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.jetstream.store import WRONG_LAST_SEQUENCE
from ftrain.events.log_port import AppendConflict, Appended, LogUnavailable
from ftrain.events.record import run_subject
from ftrain.events.schema import (
    Actor,
    AnyEvent,
    Checkpointed,
    Failed,
    Resumed,
    encode_event,
    now,
)
from ftrain.projections.projector import Projector
from ftrain.projections.readmodel import ReadModel
from ftrain.service import RunService
from ftrain.service.run_commands import checkpoint_storage
from ftrain.service.run_queries import readmodel_path
from tests.support.builders import SIGNER
from tests.support.processes import ftrain_process
from tests.support.runs import checkpoint, launch, launch_maker, stored
from tests.support.servers import kill_server, plain_connect, restart_server, stream_last_seq
from tests.unit.test_racing_services import (
    assert_one_skip_then_one_resume,
    failed_run_with_corrupt_newest_checkpoint,
)

MALLORY = Actor(user="mallory", host="elsewhere", pid=666)
SHORT_DEADLINE_S = 3.0
CLI_LIMIT_S = 30.0


# -- helpers -------------------------------------------------------------------------------------------------


def run_ftrain(
    args: list[str], env: dict[str, str], limit_s: float = CLI_LIMIT_S
) -> subprocess.CompletedProcess[str]:
    """The real `ftrain` console script; a run past `limit_s` fails the test, showing what it wrote."""
    try:
        return ftrain_process(args, env, limit_s)
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed it
        out = [
            x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
            for x in (exc.stdout, exc.stderr)
        ]
        pytest.fail(
            f"`ftrain {' '.join(args)}` still running after {limit_s}s; stdout {out[0]!r}; stderr {out[1]!r}"
        )


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`run_ftrain` off the event loop, so the in-process service's connection stays served meanwhile."""
    return await asyncio.to_thread(run_ftrain, list(args), env)


async def raw_publish(server: ServerProcess, subject: str, payload: bytes) -> int:
    """A plain nats-py JetStream publish: no ftrain code, no expected-sequence or Msg-Id headers."""
    nc = await plain_connect(server.url, server.nkey_file)
    try:
        ack = await nc.jetstream().publish(subject, payload)
        return int(ack.seq)
    finally:
        await nc.close()


def stable_status(stdout: str) -> dict[str, Any]:
    """`status --json` minus the figures that grow with the wall clock."""
    doc: dict[str, Any] = json.loads(stdout)
    for grows in ("gpu_hours", "cost_hours", "running_seconds"):
        doc.pop(grows)
    for grows in ("ratio", "wall_seconds", "other_seconds"):
        doc["goodput"].pop(grows)
    return doc


def files_under(root: Path) -> list[str]:
    """Everything below `root` (relative paths), empty when it does not exist."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, f"expected exactly one line, got {text!r}"
    return lines[0]


# -- 1. forgeries published with plain nats-py ----------------------------------------------------------------


class Forgery(msgspec.Struct, frozen=True):
    """What was published behind ftrain's back, and what verify must name as the first bad event."""

    payloads: list[bytes]
    seq: int | None
    reason: str


def forge_edited(history: list[tuple[int, AnyEvent, str]], raw: dict[int, bytes]) -> Forgery:
    # A copy of the real checkpoint at per-run seq 2, renumbered as the next event, its step raised, the
    # original hash member kept.
    real_stream_seq = next(s for s, e, _ in history if isinstance(e, Checkpointed))
    payload = raw[real_stream_seq]
    forged = payload.replace(b'"seq":2,', b'"seq":5,', 1).replace(b'"step":10,', b'"step":99,', 1)
    assert forged != payload and forged.endswith(payload[-75:])  # same hash member
    return Forgery([forged], 5, "hash mismatch: the payload was altered")


def _next_checkpoint(history: list[tuple[int, AnyEvent, str]], seq: int, prev: str, step: int) -> bytes:
    template = next(e for _, e, _ in history if isinstance(e, Checkpointed))
    event = msgspec.structs.replace(
        template, seq=seq, prev_hash=prev, id=uuid.uuid4().hex, time=now(), actor=MALLORY, step=step
    )
    body = encode_event(event)
    payload, digest = seal(body, prev)
    assert digest == link_hash(prev, body)
    return payload


def forge_wrong_prev(history: list[tuple[int, AnyEvent, str]], raw: dict[int, bytes]) -> Forgery:
    # Next seq, self-consistent hash, but linked to seq 3 instead of seq 4.
    h3 = history[2][2]
    payload = _next_checkpoint(history, 5, h3, 20)
    return Forgery([payload], 5, f"prev_hash {h3[:12]}… does not match the hash of seq 4")


def forge_gap(history: list[tuple[int, AnyEvent, str]], raw: dict[int, bytes]) -> Forgery:
    h4 = history[3][2]
    return Forgery([_next_checkpoint(history, 6, h4, 20)], 6, "sequence gap: expected seq 5, found 6")


def forge_reordered(history: list[tuple[int, AnyEvent, str]], raw: dict[int, bytes]) -> Forgery:
    h4 = history[3][2]
    fifth = _next_checkpoint(history, 5, h4, 20)
    h5 = unseal(fifth)
    assert h5 is not None
    sixth = _next_checkpoint(history, 6, h5[1], 30)
    return Forgery([sixth, fifth], 6, "sequence gap: expected seq 5, found 6")


def forge_out_of_range(history: list[tuple[int, AnyEvent, str]], raw: dict[int, bytes]) -> Forgery:
    # A correctly chained checkpoint whose step no int64 holds: it once overflowed SQLite in every command.
    # (ftrain refuses to encode it, so the number is spliced into the bytes before sealing.)
    h4 = history[3][2]
    body = unseal(_next_checkpoint(history, 5, h4, 20))
    assert body is not None
    huge = body[0].replace(b'"step":20,', b'"step":99999999999999999999999,', 1)
    assert huge != body[0]
    reason = "undecodable payload (Expected `int` <= 9223372036854775807 - at `$.step`)"
    return Forgery([seal(huge, h4)[0]], None, reason)


@pytest.mark.parametrize(
    "forge",
    [forge_edited, forge_wrong_prev, forge_gap, forge_reordered, forge_out_of_range],
    ids=["edited-payload", "wrong-prev-hash", "sequence-gap", "reordered-pair", "number-out-of-range"],
)
async def test_a_forged_event_is_named_by_audit_never_applied_and_blocks_further_appends(
    app: RunService, env: dict[str, str], server: ServerProcess, forge: Any
) -> None:
    victim, bystander = "victim-run", "bystander-run"
    await launch(app, victim)
    await launch(app, bystander)
    await checkpoint(app, victim, 10)
    await checkpoint(app, bystander, 5)
    await app.fail(victim, reason="preempted", exit_code=None)
    outcome = await app.resume(victim)
    assert outcome.resumed is not None
    history = await stored(app, victim)
    assert [type(e).__name__ for _, e, _ in history] == ["Launched", "Checkpointed", "Failed", "Resumed"]
    raw = {r.stream_seq: r.payload async for batch in app.store.read(1) for r in batch}
    before = await cli(env, "status", victim, "--json")
    assert before.returncode == 0, before.stderr

    forgery = forge(history, raw)
    forged_at = [await raw_publish(server, run_subject(victim, "checkpointed"), p) for p in forgery.payloads]
    first_bad = forged_at[0]
    ok = await cli(
        env, "checkpoint", bystander, "--step", "6", "--epoch", "0", "--shards", "1", "--state", "{}"
    )
    assert ok.returncode == 0, ok.stderr  # other runs carry on, interleaved after the forgery
    total = await stream_last_seq(server)
    assert total == 6 + len(forgery.payloads) + 1

    finding = {
        "run_id": victim,
        "stream_seq": first_bad,
        "seq": forgery.seq,
        "event_type": "checkpointed",
        "reason": forgery.reason,
    }
    at = f"seq {forgery.seq}" if forgery.seq is not None else "an unsequenced event"
    described = f"run {victim}: {at} (checkpointed, stream seq {first_bad}): {forgery.reason}"

    everything = await cli(env, "audit", "verify")
    assert everything.returncode == 1, everything.stderr
    assert everything.stdout.splitlines() == [
        f"BROKEN {described}",
        f"Verified {total} event(s) in 2 run(s): 1 finding(s)",
    ]
    one_run = await cli(env, "audit", "verify", victim)
    assert one_run.returncode == 1, one_run.stderr
    assert one_run.stdout.splitlines() == [
        f"BROKEN {described}",
        f"Verified {4 + len(forgery.payloads)} event(s) in 1 run(s): 1 finding(s)",
    ]
    as_json = await cli(env, "audit", "verify", "--json")
    assert as_json.returncode == 1, as_json.stderr
    assert json.loads(as_json.stdout) == {
        "ok": False,
        "events": total,
        "runs": 2,
        "findings": [finding],
        "signers": {bystander: SIGNER},
        "stream_findings": [],
        "accepted": [],
        "ignored": [],
    }
    clean = await cli(env, "audit", "verify", bystander, "--json")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout) == {
        "ok": True,
        "events": 3,
        "runs": 1,
        "findings": [],
        "signers": {bystander: SIGNER},
        "stream_findings": [],
        "accepted": [],
        "ignored": [],
    }

    # the read model did not apply the forgery: the victim's state is exactly what it was, shown as broken
    after = await cli(env, "status", victim, "--json")
    assert after.returncode == 1, after.stderr
    assert stable_status(after.stdout) == {
        **stable_status(before.stdout),
        "state": "broken",
        "broken": finding,
    }
    state = await app.state_of(victim)
    assert (state.status, state.step, state.head.seq, len(state.checkpoints)) == ("running", 10, 4, 1)
    broken = await app.model.broken(victim)
    assert broken is not None and msgspec.to_builtins(broken) == finding
    replay = await cli(env, "replay", victim, "--json")
    assert replay.returncode == 0, replay.stderr
    rejected = [(e["stream_seq"], e["finding"]["reason"]) for e in json.loads(replay.stdout) if e["finding"]]
    assert rejected == [(first_bad, forgery.reason)] + [(s, "after a chain break") for s in forged_at[1:]]

    # nothing more may be appended to the broken run; each refusal is one line and appends nothing
    refusal = f"run {victim}'s log is broken, refusing to append: {described}"
    failed = await cli(env, "fail", victim)
    assert failed.returncode == 1
    assert one_line(failed.stderr) == f"ftrain fail: {refusal}"
    assert failed.stdout == ""
    saved = await cli(
        env, "checkpoint", victim, "--step", "50", "--epoch", "0", "--shards", "1", "--state", "{}"
    )
    assert saved.returncode == 1
    assert one_line(saved.stderr) == f"ftrain checkpoint: {refusal}"
    assert not (Path(env["FTRAIN_STORAGE"]) / victim / "step-50").exists()
    with pytest.raises(Refused, match="refusing to append"):
        await app.complete(victim, cost_gpu_hours=1.0)
    assert await stream_last_seq(server) == total
    assert (await app.state_of(victim)).head.seq == 4


# -- 2. kill -9 of the broker in the middle of a stream of appends ---------------------------------------------


@pytest.mark.own_server
async def test_acknowledged_events_survive_kill_9_of_the_broker_mid_stream(
    app: RunService, env: dict[str, str], server: ServerProcess
) -> None:
    run = "crash-run"
    first = await app.store.append(launch_maker()(run), ChainHead())
    acked: list[Appended] = [first]
    stop = asyncio.Event()

    async def appender() -> None:
        head, step = first.head, 0
        while not stop.is_set():
            step += 1
            event = Checkpointed(
                run_id=run, step=step, epoch=0, shards=1, uri="", checkpoint_hash="", size_bytes=0
            )
            appended = await app.store.append(event, head)
            acked.append(appended)
            head = appended.head

    async def acks_reach(n: int) -> None:
        while len(acked) < n:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.002)

    task = asyncio.create_task(appender())
    current = server
    try:
        for _ in range(2):
            await asyncio.wait_for(acks_reach(len(acked) + 25), 30)
            await asyncio.to_thread(kill_server, current)  # SIGKILL while an append is in flight
            current = await asyncio.to_thread(restart_server, current)  # same store dir, same port
            assert current.url == server.url
        await asyncio.wait_for(acks_reach(len(acked) + 10), 30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)

    records = await stored(app, run)
    assert [(s, e.seq, e.id) for s, e, _ in records] == [
        (a.stream_seq, a.event.seq, a.event.id) for a in acked
    ]
    assert [h for _, _, h in records] == [a.hash for a in acked]
    assert [e.seq for _, e, _ in records] == list(range(1, len(acked) + 1))  # no duplicate, no gap
    assert await stream_last_seq(current) == len(acked)
    report = await app.verify()
    assert (report.ok, report.events, report.runs) == (True, len(acked), 1)

    last_step = len(acked) - 1
    status = await cli(env, "status", run, "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert (doc["state"], doc["step"], doc["chain_head"]["seq"]) == ("running", last_step, len(acked))
    more = await cli(
        env, "checkpoint", run, "--step", str(last_step + 1), "--epoch", "1", "--shards", "1", "--state", "{}"
    )
    assert more.returncode == 0, more.stderr
    assert (Path(env["FTRAIN_STORAGE"]) / run / f"step-{last_step + 1}" / ".complete").is_file()
    audit = await cli(env, "audit", "verify")
    assert audit.returncode == 0, audit.stdout
    assert audit.stdout.splitlines() == [
        f"Verified {len(acked) + 1} event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))"
    ]


# -- 3. the broker is down -----------------------------------------------------------------------------------


@pytest.mark.own_server
async def test_cli_with_the_broker_down_exits_1_with_one_line_and_writes_nothing(
    env: dict[str, str], server: ServerProcess
) -> None:
    run = "dist-P-1x1"
    launched = await cli(env, "launch", "P", "--nodes", "1", "--gpus-per-node", "1")
    assert launched.returncode == 0, launched.stderr
    kill_server(server)

    ckpt_args = ("checkpoint", run, "--step", "10", "--epoch", "0", "--shards", "1", "--state", '{"a":1}')
    results = await asyncio.gather(cli(env, "status", run), cli(env, *ckpt_args), cli(env, "fail", run))
    assert files_under(Path(env["FTRAIN_STORAGE"])) == []  # no checkpoint directory, not even a temp one
    for done, command in zip(results, ("status", "checkpoint", "fail"), strict=True):
        assert done.returncode == 1
        assert done.stdout == ""
        line = one_line(done.stderr)
        assert line.startswith(f"ftrain {command}: event log unreachable at {server.url}"), line
        assert "Traceback" not in done.stderr


@contextlib.asynccontextmanager
async def service_with_deadline(env: dict[str, str], deadline: float) -> AsyncIterator[RunService]:
    """`RunService.open(env)` put together by hand, with a short log deadline instead of the default 30 s."""
    nats = settings.nats(env)
    async with open_store(nats, deadline=deadline) as store:
        stream_id = await store.ensure_stream()
        model = await ReadModel.open(readmodel_path(nats))
        try:
            yield RunService(store, model, Projector(store, model, stream_id), checkpoint_storage(env))
        finally:
            await model.close()


@pytest.mark.own_server
async def test_service_whose_broker_dies_raises_log_unavailable_and_writes_nothing(
    env: dict[str, str], server: ServerProcess
) -> None:
    run = "orphan-run"
    storage = Path(env["FTRAIN_STORAGE"])
    opened = service_with_deadline(env, SHORT_DEADLINE_S)
    app = await opened.__aenter__()
    try:
        await launch(app, run)
        await checkpoint(app, run, 10)
        kill_server(server)
        # what the CLI turns into exit 1 and one line; raised by the store's retries giving up at their
        # deadline ("event log unreachable (<call>: <error>)"), not by the connection's own limit
        with pytest.raises(LogUnavailable, match=r"^event log unreachable \(\w[^:]*: \w+\)$"):
            await checkpoint(app, run, 20)
    finally:
        with contextlib.suppress(OSError):  # closing is the next test's subject
            await opened.__aexit__(None, None, None)
    assert files_under(storage / run)[:1] == ["step-10"]
    assert not any(name.startswith(("step-20", ".step-20")) for name in files_under(storage / run))


@pytest.mark.own_server
async def test_log_unavailable_survives_closing_the_service_after_the_broker_died(
    env: dict[str, str], server: ServerProcess
) -> None:
    # The CLI maps LogUnavailable escaping `async with RunService.open()` to exit 1 and one line; closing the
    # connection to a dead broker must not replace it with another exception (a traceback).
    async def a_command_during_which_the_broker_dies() -> None:
        async with service_with_deadline(env, SHORT_DEADLINE_S) as app:
            await launch(app, "orphan-run")
            kill_server(server)
            await asyncio.wait_for(app.states(), 4 * SHORT_DEADLINE_S)

    with pytest.raises(LogUnavailable):
        await a_command_during_which_the_broker_dies()


async def test_a_corrupt_read_model_file_is_set_aside_and_rebuilt_from_the_log(env: dict[str, str]) -> None:
    # The read model is a disposable projection of the log; a garbage file in its place (a torn copy, a full
    # disk) must neither hang nor fail the command: it is moved aside, kept for a post-mortem, and rebuilt.
    run = "dist-P-1x1"
    launched = await cli(env, "launch", "P", "--nodes", "1", "--gpus-per-node", "1")
    assert launched.returncode == 0, launched.stderr
    path = readmodel_path(settings.nats(env))
    for leftover in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)
    garbage = b"this is not an SQLite database\n" * 200
    path.write_bytes(garbage)
    done = await cli(env, "status", run, "--json")
    assert (done.returncode, "Traceback" in done.stderr) == (0, False), done.stderr
    assert json.loads(done.stdout)["chain_head"]["seq"] == 1
    (set_aside,) = path.parent.glob(f"{path.name}.unreadable-*")
    assert set_aside.read_bytes() == garbage
    async with await ReadModel.open(path) as model:
        assert (await model.run(run)) is not None


# -- 4. races ------------------------------------------------------------------------------------------------


async def test_two_cli_resumes_race_one_skip_one_resume_and_a_one_line_refusal(
    app: RunService, env: dict[str, str]
) -> None:
    run, storage = "race-resume", Path(env["FTRAIN_STORAGE"])
    await failed_run_with_corrupt_newest_checkpoint(app, storage, run)
    barrier = threading.Barrier(2)

    def resume() -> subprocess.CompletedProcess[str]:
        barrier.wait()
        return run_ftrain(["resume", run], env)

    results = await asyncio.gather(asyncio.to_thread(resume), asyncio.to_thread(resume))
    assert sorted(r.returncode for r in results) == [0, 1], [r.stderr for r in results]
    assert [r.stderr for r in results if "chain_break" in r.stderr] == []  # no false alarm of tampering
    winner = next(r for r in results if r.returncode == 0)
    loser = next(r for r in results if r.returncode == 1)
    assert (
        one_line(loser.stderr)
        == f"ftrain resume: run {run} is running; resume follows a failure (or use --force)"
    )
    uri = (storage / run / "step-10").absolute().as_uri()
    assert f"Resuming {run} from step 10 epoch 0 ({uri}) — optimizer state preserved." in winner.stdout
    assert "Resuming" not in loser.stdout
    skip_line = "checkpoint step 20 file state.json hash mismatch → skipped"
    assert sum(r.stdout.splitlines().count(skip_line) for r in results) == 1
    assert_one_skip_then_one_resume(await stored(app, run), storage, run)
    audit = await cli(env, "audit", "verify", run)
    assert audit.returncode == 0, audit.stdout
    assert audit.stdout.splitlines() == [
        f"Verified 6 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))"
    ]


LOST_RACE_SCRIPT = """
import asyncio, os, sys
from ftrain.logs import configure
from ftrain.service import RunService

async def main(run):
    async with RunService.open(os.environ) as mine, RunService.open(os.environ) as theirs:
        start = await mine.model.position()  # what `catch_up` reads first ...
        await theirs.fail(run, reason="oom", exit_code=1)  # ... then another process appends and applies ...
        await theirs.projector.catch_up()
        print(await mine.projector._apply_from(start))  # ... before this process applies from `start`

configure()  # logging exactly as the CLI sets it up: warnings to stderr
asyncio.run(main(sys.argv[1]))
"""


async def test_a_projector_that_loses_the_catch_up_race_reports_no_chain_break(
    app: RunService, env: dict[str, str]
) -> None:
    # Two CLI processes catching up one read model at once (e.g. the racing resumes above): the one that
    # loses must simply retry, not announce a chain break in a chain that is intact.
    run = "raced-projector"
    await launch(app, run)
    await checkpoint(app, run, 10)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", LOST_RACE_SCRIPT, run],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=CLI_LIMIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "(0, False)\n"  # the loser's commit was refused: nothing it folded was written
    assert "chain_break" not in done.stderr, done.stderr
    assert done.stderr == ""
    assert await app.model.broken(run) is None
    state = await app.state_of(run)
    assert (state.status, state.head.seq) == ("failed", 3)
    assert (await app.verify(run)).ok


async def test_two_cli_launches_race_to_distinct_run_ids(env: dict[str, str], server: ServerProcess) -> None:
    barrier = threading.Barrier(2)

    def launch_cli() -> subprocess.CompletedProcess[str]:
        barrier.wait()
        return run_ftrain(["launch", "P", "--nodes", "1", "--gpus-per-node", "1"], env)

    results = await asyncio.gather(asyncio.to_thread(launch_cli), asyncio.to_thread(launch_cli))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    ids = sorted(r.stdout.split()[1] for r in results)
    assert ids == ["dist-P-1x1", "dist-P-1x1-2"]
    assert await stream_last_seq(server) == 2
    audit = await cli(env, "audit", "verify")
    assert audit.returncode == 0, audit.stdout
    assert audit.stdout.splitlines() == [
        f"Verified 2 event(s) in 2 run(s): every chain intact and anchored; signed by {SIGNER} (2 run(s))"
    ]


# -- 5. the retry of a publish whose ack was lost -----------------------------------------------------------


async def test_a_retried_append_whose_first_try_landed_is_stored_once(
    app: RunService, server: ServerProcess
) -> None:
    run = "retry-run"
    launched = await app.store.append(launch_maker()(run), ChainHead())
    saved = await app.store.append(
        Checkpointed(
            run_id=run, step=10, epoch=0, shards=1, uri="file:///c", checkpoint_hash="c" * 64, size_bytes=1
        ),
        launched.head,
    )
    failed = await app.store.append(Failed(run_id=run, reason="oom"), saved.head)
    assert await stream_last_seq(server) == 3

    # the retry the store would send for the same stamped event: byte-identical, same Msg-Id, and an
    # expected subject sequence that is now stale; the server answers 10071 and stores no copy
    payload, digest = seal(encode_event(failed.event), saved.head.hash)
    assert digest == failed.hash
    nc = await plain_connect(server.url, server.nkey_file)
    try:
        with pytest.raises(BadRequestError) as refused:
            await nc.jetstream().publish(
                run_subject(run, "failed"),
                payload,
                headers={
                    "Nats-Msg-Id": failed.event.id,
                    "Nats-Expected-Last-Subject-Sequence": str(saved.head.stream_seq),
                    "Nats-Expected-Last-Subject-Sequence-Subject": run_subject(run),
                },
            )
        assert refused.value.err_code == WRONG_LAST_SEQUENCE
    finally:
        await nc.close()
    assert await stream_last_seq(server) == 3

    # through the store: recognised as our own event at the head, success, the original returned
    again = await app.store.append(failed.event, saved.head)
    assert again == failed
    assert await stream_last_seq(server) == 3
    records = await stored(app, run)
    assert [(s, e.id, h) for s, e, h in records] == [
        (1, launched.event.id, launched.hash),
        (2, saved.event.id, saved.hash),
        (3, failed.event.id, failed.hash),
    ]

    # someone else's event on the same stale head is a conflict, and nothing is stored
    with pytest.raises(AppendConflict):
        await app.store.append(Failed(run_id=run, reason="signal"), saved.head)
    assert await stream_last_seq(server) == 3

    # the chain carries on from the head the retry returned
    resumed = await app.store.append(
        Resumed(
            run_id=run,
            checkpoint_seq=2,
            step=10,
            epoch=0,
            uri="file:///c",
            checkpoint_hash="c" * 64,
            resume_count=1,
        ),
        again.head,
    )
    assert (resumed.event.seq, resumed.event.prev_hash, resumed.stream_seq) == (4, failed.hash, 4)
    # our event is no longer the head: a late retry of it is a conflict, not a second copy
    with pytest.raises(AppendConflict):
        await app.store.append(failed.event, saved.head)
    assert await stream_last_seq(server) == 4
    assert [e.seq for _, e, _ in await stored(app, run)] == [1, 2, 3, 4]
    report = await app.verify(run)
    assert (report.ok, report.events, report.runs) == (True, 4, 1)
    state = await app.state_of(run)
    assert (state.status, state.resume_count, state.failures, state.head) == ("running", 1, 1, resumed.head)


async def test_an_event_filed_under_a_subject_ftrain_never_writes_is_reported(
    app: RunService, env: dict[str, str], server: ServerProcess
) -> None:
    await launch(app, "good")
    history = await stored(app, "good")
    payload = encode_event(msgspec.structs.replace(history[0][1], seq=2, prev_hash=history[0][2]))
    forged, _ = seal(payload, history[0][2])
    await raw_publish(server, "ftrain.run.good.extra.failed", forged)
    await raw_publish(server, "ftrain.run.good", forged)  # the bare subject: no event type (issue 32)
    audit = await cli(env, "audit", "verify")
    assert audit.returncode == 1
    assert audit.stdout.splitlines() == [
        f"STREAM: stream seq {seq}: filed under no run: {subject} is not ftrain.run.<run_id>.<event_type>"
        for seq, subject in ((2, "ftrain.run.good.extra.failed"), (3, "ftrain.run.good"))
    ] + ["Verified 3 event(s) in 1 run(s): 2 finding(s)"]
    # a stray belongs to no run and breaks none: every command says the real run is intact, names no other
    assert (await cli(env, "audit", "verify", "good")).returncode == 0
    status = await cli(env, "status", "good")
    assert (status.returncode, status.stdout.splitlines()[0]) == (0, "run         good (project P)")
    [row] = json.loads((await cli(env, "list", "--json")).stdout)
    assert (row["run_id"], row["state"]) == ("good", "running")
    tail = [json.loads(line) for line in (await cli(env, "events", "tail", "--json")).stdout.splitlines()]
    assert [t["chain"].split(":")[0] for t in tail] == ["ok", "filed under no run", "filed under no run"]
    for named in ("good.extra", "good."):  # the one run id rule: no command takes a dotted id
        refused = await cli(env, "status", named)
        assert refused.returncode == 2 and "is invalid" in refused.stderr


async def test_two_checkpoints_of_one_step_race_one_lands_and_the_loser_is_not_told_to_delete_it(
    app: RunService, env: dict[str, str]
) -> None:
    """Both pass the step check; the loser finds the directory the winner wrote (and recorded, or is about
    to): it must never be told plainly to remove a checkpoint the log has or is about to have."""
    run = "race-ckpt"
    await launch(app, run)
    barrier = threading.Barrier(2)

    def checkpoint() -> subprocess.CompletedProcess[str]:
        barrier.wait()
        return run_ftrain(
            ["checkpoint", run, "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}"], env
        )

    results = await asyncio.gather(asyncio.to_thread(checkpoint), asyncio.to_thread(checkpoint))
    assert sorted(r.returncode for r in results) == [0, 1], [r.stderr for r in results]
    loser = one_line(next(r for r in results if r.returncode == 1).stderr)
    step_dir = Path(env["FTRAIN_STORAGE"]) / run / "step-10"
    assert loser in (
        f"ftrain checkpoint: run {run} already has checkpoint step 10 (another writer got there first)",
        f"ftrain checkpoint: run {run} is at step 10; checkpoint step 10 does not advance it",
        f"ftrain checkpoint: {step_dir} already exists but the log has no such checkpoint yet: another writer "
        "may be recording it, or a save was interrupted (then remove it)",
    )
    assert [c.step for c in (await app.state_of(run)).checkpoints] == [10]
