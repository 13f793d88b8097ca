"""The attacks of the trust issue, run against a real nats-server: forged events, an erased, truncated,
reconfigured or rolled-back stream, and logs from before signing. Each asserts on what survived."""

import asyncio
import fcntl
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import nats
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client

from ftrain import settings
from ftrain.domain.chain_walk import Folded, fold_record
from ftrain.domain.lifecycle import RunState, completed_event
from ftrain.events.chain import seal, unseal
from ftrain.events.jetstream.connection import open_store
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.record import STREAM, StoredRecord, run_subject
from ftrain.events.schema import AnyEvent, CorruptSkipped, Failed, Resumed, encode_event, event_type, now
from ftrain.events.signing import Signer
from ftrain.service import RunService
from ftrain.train.resume import RunBroken, read_run
from tests.integration.test_failures import MALLORY
from tests.support.builders import SIGNER
from tests.support.processes import ftrain_process
from tests.support.runs import checkpoint, launch
from tests.support.servers import kill_server, plain_connect, restart_server

MARKER = "pwned"


@asynccontextmanager
async def intruder(server: ServerProcess) -> AsyncIterator[Client]:
    """A plain nats-py client with the broker's credentials: another user of a shared cluster."""
    nc = await plain_connect(server.url, server.nkey_file)
    try:
        yield nc
    finally:
        await nc.close()


def run(
    env: dict[str, str], *args: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return ftrain_process(list(args), {**env, **(extra or {})})


async def forge(
    server: ServerProcess, state: RunState, event: AnyEvent, signer: Signer | None
) -> tuple[int, bytes]:
    """Publish `event` as the next link of the run, correctly chained (and legal: the fold accepts it),
    unsigned or signed by `signer`; returns its stream seq and payload."""
    stamped = msgspec.structs.replace(
        event,
        seq=state.head.seq + 1,
        prev_hash=state.head.hash,
        id=os.urandom(16).hex(),
        time=now(),
        actor=MALLORY,
    )
    payload, _ = seal(encode_event(stamped), state.head.hash, signer.sign_hash if signer else None)
    assert isinstance(fold_record(state, StoredRecord(0, event.run_id, event_type(event), payload)), Folded)
    async with intruder(server) as nc:
        ack = await nc.jetstream().publish(run_subject(event.run_id, event_type(event)), payload)
    return int(ack.seq), payload


def malicious_checkpoint(root: Path) -> Path:
    """A directory outside every storage root whose pickle would touch MARKER if anything unpickled it."""
    victim = root / "elsewhere" / "step-99"
    victim.mkdir(parents=True)
    (victim / ".metadata").write_bytes(b"cos\nsystem\n(S'touch " + str(root / MARKER).encode() + b"'\ntR.")
    return victim


# -- forged events ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("signed_by", ["nobody", "mallory"])
async def test_a_forged_correctly_chained_event_of_every_type_is_named_and_never_acted_on(
    app: RunService, env: dict[str, str], server: ServerProcess, tmp_path: Path, signed_by: str
) -> None:
    mallory = Signer(Ed25519PrivateKey.generate()) if signed_by == "mallory" else None
    outside = malicious_checkpoint(tmp_path)
    forged_at: dict[str, tuple[str, int]] = {}
    for kind in ("checkpointed", "failed", "resumed", "corrupt_skipped", "completed"):
        run_id = f"victim-{kind.replace('_', '-')}"
        await launch(app, run_id)
        real = await checkpoint(app, run_id, 10)
        if kind in ("resumed", "corrupt_skipped"):
            await app.fail(run_id, reason="preempted", exit_code=None)
        state = await app.state_of(run_id)
        ref = state.checkpoints[-1]
        uri = outside.as_uri()
        event: AnyEvent = {
            "checkpointed": msgspec.structs.replace(real, step=99, uri=uri),
            "failed": Failed(run_id=run_id, reason="preempted", attempt=state.attempt),
            "resumed": Resumed(run_id=run_id, checkpoint_seq=ref.seq, step=ref.step, epoch=ref.epoch, uri=uri,
                               checkpoint_hash=ref.checkpoint_hash, resume_count=1, attempt=state.attempt + 1),
            "corrupt_skipped": CorruptSkipped(run_id=run_id, checkpoint_seq=ref.seq, step=ref.step,
                                              uri=ref.uri, reason="forged"),
            "completed": completed_event(state, None, now()),
        }[kind]  # fmt: skip
        stream_seq, _ = await forge(server, state, event, mallory)
        forged_at[run_id] = (kind, stream_seq)

    audit = run(env, "audit", "verify")
    assert audit.returncode == 1, audit.stderr
    why = "unsigned" if mallory is None else "signed by untrusted key ed25519:"
    for run_id, (kind, stream_seq) in forged_at.items():
        seq = 3 if kind in ("checkpointed", "failed", "completed") else 4
        line = f"BROKEN run {run_id}: seq {seq} ({kind}, stream seq {stream_seq}): {why}"
        assert any(out.startswith(line) for out in audit.stdout.splitlines()), (line, audit.stdout)

    for run_id in forged_at:
        status = run(env, "status", run_id)
        assert status.returncode == 1 and status.stdout.startswith(f"BROKEN run {run_id}: seq "), status
    for run_id in forged_at:  # nothing acts on a run no trusted writer vouches for
        for args in (("resume", run_id), ("complete", run_id), ("fail", run_id, "--reason", "preempted")):
            refused = run(env, *args)
            assert refused.returncode == 1 and f"run {run_id}'s log is broken" in refused.stderr, refused
        with pytest.raises(RunBroken, match=why):
            await asyncio.to_thread(read_run, run_id, settings.nats(env), 10)
    assert sorted(p.name for p in outside.parent.iterdir()) == ["step-99"]  # never set aside
    assert not (tmp_path / MARKER).exists()


async def test_a_forged_launch_of_a_new_run_is_named(
    app: RunService, env: dict[str, str], server: ServerProcess
) -> None:
    made = await launch(app, "real-run")
    forged = msgspec.structs.replace(
        made, run_id="ghost-run", seq=1, prev_hash="0" * 64, id="", actor=MALLORY
    )
    payload, _ = seal(encode_event(msgspec.structs.replace(forged, time=now())), "0" * 64)
    async with intruder(server) as nc:
        await nc.jetstream().publish(run_subject("ghost-run", "launched"), payload)
    audit = run(env, "audit", "verify")
    assert audit.returncode == 1
    assert "BROKEN run ghost-run: seq 1 (launched, stream seq 2): unsigned" in audit.stdout
    assert run(env, "audit", "verify", "real-run").returncode == 0


# -- logs from before signing ----------------------------------------------------------------------------


async def test_an_unsigned_log_verifies_as_unsigned_and_is_acted_on_only_when_accepted(
    app: RunService, env: dict[str, str], server: ServerProcess
) -> None:
    made = await launch(app, "old-run")
    records = [r async for batch in app.store.read(1) for r in batch]
    old = unseal(records[0].payload)
    assert old is not None and old.signature is not None
    async with intruder(server) as nc:  # the same run as an older ftrain stored it: no signature
        await nc.jetstream().delete_stream(STREAM)
        await nc.jetstream().add_stream(app.store.config())
        await nc.jetstream().publish(
            run_subject("old-run", "launched"), old.body[:-1] + f',"hash":"{old.hash}"}}'.encode()
        )
    assert made.run_id == "old-run"
    assert run(env, "server", "repair").returncode == 0  # the stream was re-created: accepted on record

    refused = run(env, "audit", "verify")
    assert (
        refused.returncode == 1
        and "BROKEN run old-run: seq 1 (launched, stream seq 1): unsigned" in refused.stdout
    )
    assert run(env, "fail", "old-run", "--reason", "preempted").returncode == 1

    accepting = {settings.ACCEPT_UNSIGNED: "1"}
    audit = run(env, "audit", "verify", extra=accepting)
    assert audit.returncode == 0, audit.stdout
    assert audit.stdout.splitlines()[-1] == (
        "Verified 1 event(s) in 1 run(s): every chain intact and anchored; signed by unsigned, accepted (1 run(s))"
    )
    assert run(env, "fail", "old-run", "--reason", "preempted", extra=accepting).returncode == 0
    # once a trusted writer appended, its signature vouches for the old events too
    assert run(env, "audit", "verify").stdout.splitlines()[-1].endswith(f"signed by {SIGNER} (1 run(s))")


# -- the stream erased, truncated, reconfigured, rolled back -----------------------------------------------


async def history(app: RunService) -> None:
    await launch(app, "victim")
    await checkpoint(app, "victim", 10)
    await checkpoint(app, "victim", 20)
    await launch(app, "bystander")
    await checkpoint(app, "bystander", 5)


async def republish(server: ServerProcess, app: RunService, keep: Callable[[int], bool]) -> None:
    """Delete the stream and publish its records again, in order, except those `keep` refuses."""
    records = [r async for batch in app.store.read(1) for r in batch]
    config = app.store.config()
    async with intruder(server) as nc:
        js = nc.jetstream()
        await js.delete_stream(STREAM)
        await js.add_stream(config)
        for r in records:
            if keep(r.stream_seq):
                await js.publish(run_subject(r.run_id, r.event_type), r.payload)


async def test_a_deleted_stream_is_never_silently_re_created(
    app: RunService, env: dict[str, str], server: ServerProcess
) -> None:
    await history(app)
    async with intruder(server) as nc:
        await nc.jetstream().delete_stream(STREAM)
    status = run(env, "status", "victim")
    assert status.returncode == 1
    assert status.stderr.startswith("ftrain status: stream FTRAIN_EVENTS is gone (anchored: created ")
    assert "`ftrain server repair` accepts it" in status.stderr and "\n" not in status.stderr.strip()
    async with intruder(server) as nc:
        with pytest.raises(nats.js.errors.NotFoundError):
            await nc.jetstream().stream_info(STREAM)  # refused, not re-created
    audit = run(env, "audit", "verify")
    assert audit.returncode == 1
    assert "STREAM: stream FTRAIN_EVENTS is gone" in audit.stdout
    assert "BROKEN run victim: seq 3 (, stream seq 3): the log holds none of its events" in audit.stdout

    repaired = run(env, "server", "repair")
    assert repaired.returncode == 0 and "what differed: stream FTRAIN_EVENTS is gone" in repaired.stdout
    after = run(env, "audit", "verify")
    assert after.returncode == 0, after.stdout
    assert after.stdout.splitlines()[0].startswith("accepted by `ftrain server repair`: ")
    assert run(env, "status", "victim").returncode == 1  # not found now: the history is gone, and says so


@pytest.mark.parametrize("cut", ["tail", "middle"])
async def test_a_republished_stream_missing_events_is_detected(
    app: RunService, env: dict[str, str], server: ServerProcess, cut: str
) -> None:
    await history(app)  # victim: stream seqs 1-3, bystander 4-5
    await republish(server, app, lambda seq: seq != (3 if cut == "tail" else 2))
    refused = run(
        env, "checkpoint", "victim", "--step", "30", "--epoch", "0", "--shards", "1", "--state", "{}"
    )
    assert refused.returncode == 1 and "was re-created" in refused.stderr
    audit = run(env, "audit", "verify")
    assert audit.returncode == 1
    assert "STREAM: stream FTRAIN_EVENTS was re-created" in audit.stdout
    if cut == "tail":  # the chain is consistent: only the anchor knows seq 3 existed
        assert "BROKEN run victim: seq 3 (, stream seq 3): its head went back from seq 3" in audit.stdout
    else:
        assert (
            "BROKEN run victim: seq 3 (checkpointed, stream seq 2): sequence gap: expected seq 2"
            in audit.stdout
        )


async def test_a_changed_retention_limit_is_refused_and_reported(
    app: RunService, env: dict[str, str], server: ServerProcess
) -> None:
    await history(app)
    config = app.store.config()
    config.max_age = 3600.0
    async with intruder(server) as nc:
        await nc.jetstream().update_stream(config)
    refused = run(env, "list")
    assert refused.returncode == 1 and "configuration changed: max_age 0.0 → 3600.0" in refused.stderr
    audit = run(env, "audit", "verify")
    assert audit.returncode == 1 and "STREAM: stream FTRAIN_EVENTS's configuration changed" in audit.stdout
    assert run(env, "server", "repair").returncode == 0  # restores ftrain's settings, on record
    async with intruder(server) as nc:
        assert (await nc.jetstream().stream_info(STREAM)).config.max_age == 0
    assert run(env, "list").returncode == 0


@pytest.mark.own_server
async def test_a_store_restored_from_an_older_copy_is_detected(
    app: RunService, env: dict[str, str], server: ServerProcess, tmp_path: Path
) -> None:
    await history(app)
    kill_server(server)
    store = Path(server.store_dir)
    shutil.copytree(store, tmp_path / "backup")
    server2 = restart_server(server)
    more = run(env, "checkpoint", "victim", "--step", "30", "--epoch", "0", "--shards", "1", "--state", "{}")
    assert more.returncode == 0, more.stderr
    kill_server(server2)
    shutil.rmtree(store)
    shutil.copytree(tmp_path / "backup", store)
    restart_server(server2)
    refused = run(env, "status", "victim")
    assert refused.returncode == 1 and "went back from seq 6 to 5" in refused.stderr
    audit = run(env, "audit", "verify")
    assert audit.returncode == 1
    assert "BROKEN run victim: seq 4 (, stream seq 6): its head went back from seq 4" in audit.stdout


# -- keys ------------------------------------------------------------------------------------------------


async def test_revoking_the_writer_makes_its_runs_untrusted_until_trusted_again(
    app: RunService, env: dict[str, str]
) -> None:
    await history(app)
    shown = run(env, "keys", "show")
    assert shown.returncode == 0
    own = shown.stdout.splitlines()[0]
    assert own.startswith("ed25519:") and f"trusted  {own} {SIGNER}" in shown.stdout
    assert run(env, "keys", "revoke", SIGNER).returncode == 0
    audit = run(env, "audit", "verify")
    assert audit.returncode == 1 and f"signed by revoked key {own[:24]}… ({SIGNER})" in audit.stdout
    assert run(env, "keys", "trust", SIGNER, own).returncode == 0
    assert run(env, "audit", "verify").returncode == 0
    bad = run(env, "keys", "trust", "bob", "ed25519:xyz")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert run(env, "keys", "revoke", "nobody").returncode == 1


def test_another_uid_can_read_neither_the_key_nor_the_anchors(env: dict[str, str]) -> None:
    assert run(env, "keys", "init").returncode == 0
    home = Path(env["FTRAIN_HOME"])
    for path in (home / "keys" / "signing.key", home / "keys" / "trusted"):
        probe = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)],
            capture_output=True, check=False,
        )  # fmt: skip
        assert probe.returncode != 0 and probe.stdout == b""
    assert (home / "keys").stat().st_mode & 0o777 == 0o700


def home_anchors(env: dict[str, str], restore: bytes | None = None) -> bytes:
    """The anchor file under FTRAIN_HOME: its bytes, or put back to `restore`."""
    path = next(Path(env["FTRAIN_HOME"]).glob("anchors*.log"))
    if restore is not None:
        path.write_bytes(restore)
    return path.read_bytes()


@pytest.mark.own_server
async def test_the_anchor_mirror_catches_a_rollback_of_the_store_and_the_home_together(
    app: RunService, env: dict[str, str], server: ServerProcess, tmp_path: Path
) -> None:
    mirrored = {**env, settings.ANCHOR_MIRROR: str(tmp_path / "mirror")}
    await launch(app, "victim")
    step = ["checkpoint", "victim", "--epoch", "0", "--shards", "1", "--state", "{}", "--step"]
    assert run(mirrored, *step, "10").returncode == 0
    kill_server(server)
    saved_anchors = home_anchors(env)
    shutil.copytree(server.store_dir, tmp_path / "backup")
    server2 = restart_server(server)
    assert run(mirrored, *step, "20").returncode == 0
    kill_server(server2)
    shutil.rmtree(server2.store_dir)
    shutil.copytree(tmp_path / "backup", server2.store_dir)
    home_anchors(env, saved_anchors)  # whoever restored the store restored the home too
    restart_server(server2)
    assert run(env, "status", "victim").returncode == 0  # the home alone cannot tell
    refused = run(mirrored, "status", "victim")
    assert refused.returncode == 1 and "went back from seq 3 to 2" in refused.stderr
    audit = run(mirrored, "audit", "verify")
    assert audit.returncode == 1 and "its head went back from seq 3" in audit.stdout


async def test_a_writer_appending_and_anchoring_while_another_opens_the_store_is_no_rollback(
    app: RunService, env: dict[str, str]
) -> None:
    """Two writers starting at once (two requeues of one job): one appends and anchors the new head between
    the other's reading of the stream and of the anchors. Read in that order, the anchor was ahead of the
    stream this process saw, and it refused to append as if the stream had been rolled back."""
    await launch(app, "first")
    async with open_store(settings.nats(env)) as store:
        read_stream, steps = store.facts, iter(range(10, 100, 10))

        async def stream_then_another_writer() -> object:
            facts = await read_stream()
            await checkpoint(app, "first", next(steps))  # appended and anchored by the other writer, now
            return facts

        store.facts = stream_then_another_writer  # type: ignore[method-assign]
        await store.ensure_stream()
        await store.repair()
    assert run(env, "status", "first").returncode == 0


def hold_anchor_lock(env: dict[str, str]) -> int:
    """The home's anchor file, opened and flocked as a process stopped mid-append would hold it."""
    fd = os.open(next(Path(env["FTRAIN_HOME"]).glob("anchors*.log")), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_a_stopped_process_holding_the_anchor_file_never_stalls_a_command(
    app: RunService, env: dict[str, str]
) -> None:
    await launch(app, "victim")
    await checkpoint(app, "victim", 10)
    holder = hold_anchor_lock(env)
    try:
        failed = run(env, "fail", "victim")
    finally:
        os.close(holder)
    assert failed.returncode == 0, failed.stderr
    assert "anchor_not_written" in failed.stderr and "locked by another process" in failed.stderr
    assert (await app.state_of("victim")).status == "failed"  # recorded, and said that its note was not
