"""Only signed, chained anchor notes count (issue 22, finding 4), against a real nats-server: the finding as
reproduced. A stream deleted and re-created, with an unsigned note appended to the mirror by whoever can write
it, is refused by the stream check of every open, named by `server repair` and `audit verify` (the readers and
the writer on real files alone: tests/unit/test_anchor_trust.py)."""

import asyncio
from pathlib import Path

import msgspec
import nats.js.errors
import pytest
from nats.js import JetStreamContext

from ftrain import settings
from ftrain.events.anchor_file import read_lines
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.keyring import load_signer
from ftrain.events.record import STREAM
from ftrain.events.schema import now
from ftrain.service import RunService
from tests.integration.test_trust import intruder, run
from tests.support.runs import checkpoint, launch
from tests.unit.test_anchor_trust import MALLORY, append, forged_line, note

STORE_NOT_CREATED = 10049
"""JetStream's "error creating store for stream"."""


def home_anchors(env: dict[str, str]) -> Path:
    """The home's anchor file."""
    return next(Path(env["FTRAIN_HOME"]).glob("anchors*.log"))


def mirror_of_home(env: dict[str, str], mirror: Path) -> Path:
    """A mirror directory holding a copy of the home's anchor file, as the mirror of every note would."""
    home_file = home_anchors(env)
    mirror.mkdir(mode=0o700)
    (mirror / home_file.name).write_bytes(home_file.read_bytes())
    return mirror / home_file.name


async def recreate_stream(js: JetStreamContext, app: RunService) -> None:
    """Delete the stream and create it anew, empty, as an intruder with the account's credentials would. The
    server may still be removing the old stream's files (JetStream err 10049, seen once in CI on the shared
    server): the intruder just tries again."""
    await js.delete_stream(STREAM)
    for attempt in range(50):
        try:
            await js.add_stream(app.store.config())
            return
        except nats.js.errors.ServerError as exc:
            if exc.err_code != STORE_NOT_CREATED or attempt == 49:
                raise
            await asyncio.sleep(0.1)


async def forge_recreated_stream(
    app: RunService, env: dict[str, str], server: ServerProcess, mirror: Path
) -> tuple[Path, int]:
    """What the finding did: a cluster user deletes and re-creates the stream (it loses every event), and
    whoever can write the mirror appends one unsigned note naming the new stream, seen past the home's notes.
    Returns the mirror file and the forged line's byte offset."""
    mirrored = mirror_of_home(env, mirror)
    async with intruder(server) as nc:
        js = nc.jetstream()
        await recreate_stream(js, app)
        for _ in range(5):  # the new stream's last sequence passes the home's newest note
            await js.publish("ftrain.run.pad.failed", b"{}")
    facts = await app.store.facts()
    assert facts is not None
    forged = note(facts.last_seq, created=facts.created, config=facts.config, time=now())
    return mirrored, append(mirrored, forged_line(mirrored, forged))


@pytest.fixture
async def recreated(
    app: RunService, env: dict[str, str], server: ServerProcess, tmp_path: Path
) -> tuple[dict[str, str], Path, int]:
    """A run that vanished with its stream, and the mirror's forged note: the environment that reads the
    mirror, the mirror file, and the forged line's offset."""
    await launch(app, "victim")
    await checkpoint(app, "victim", 10)
    mirror, at = await forge_recreated_stream(app, env, server, tmp_path / "mirror")
    return {**env, settings.ANCHOR_MIRROR: str(mirror.parent)}, mirror, at


async def test_an_unsigned_note_in_the_mirror_never_makes_a_re_created_stream_acceptable(
    app: RunService, recreated: tuple[dict[str, str], Path, int]
) -> None:
    mirrored, _, _ = recreated
    relaunch = run(mirrored, "launch", "P", "--run-id", "victim", "--nodes", "1", "--gpus-per-node", "1")
    assert relaunch.returncode == 1, relaunch.stdout
    assert "stream FTRAIN_EVENTS was re-created" in relaunch.stderr
    assert "anchor_notes_ignored" in relaunch.stderr and "is unsigned: ignored" in relaunch.stderr
    assert await app.store.head("victim") is None  # nothing appended under the vanished run's id


def test_server_repair_names_the_re_creation_whatever_the_mirror_claims(
    recreated: tuple[dict[str, str], Path, int],
) -> None:
    mirrored, mirror, at = recreated
    repaired = run(mirrored, "server", "repair")
    assert repaired.returncode == 0, repaired.stderr
    assert "what differed: stream FTRAIN_EVENTS was re-created" in repaired.stdout
    ignored = [line for line in repaired.stdout.splitlines() if line.startswith("ignored: anchor file ")]
    assert ignored == [f"ignored: anchor file {mirror}: the line at byte {at} is unsigned: ignored"]


async def test_audit_verify_never_takes_a_forged_repair_note_for_the_operators(
    app: RunService, env: dict[str, str], server: ServerProcess, tmp_path: Path
) -> None:
    mirrored = {**env, settings.ANCHOR_MIRROR: str(tmp_path / "mirror")}
    await launch(app, "victim")
    await checkpoint(app, "victim", 10)
    await checkpoint(app, "victim", 20)  # stream seq 3: the head the forger wants forgotten
    records = [r async for batch in app.store.read(1) for r in batch]
    mirror = mirror_of_home(env, tmp_path / "mirror")
    async with intruder(server) as nc:  # re-created, every event but the last republished
        js = nc.jetstream()
        await recreate_stream(js, app)
        for r in records[:-1]:
            await js.publish(f"ftrain.run.{r.run_id}.{r.event_type}", r.payload)
    facts = await app.store.facts()
    assert facts is not None
    forged = note(facts.last_seq, created=facts.created, config=facts.config, time=now(), note="repair: x")
    append(mirror, forged_line(mirror, forged))
    audit = run(mirrored, "audit", "verify")
    assert audit.returncode == 1
    assert "accepted by `ftrain server repair`" not in audit.stdout
    assert "STREAM: stream FTRAIN_EVENTS was re-created" in audit.stdout
    assert "BROKEN run victim: seq 3 (, stream seq 3): its head went back from seq 3" in audit.stdout
    forged_at = len(read_lines(mirror))
    assert f"ignored: anchor file {mirror}: line {forged_at} is unsigned: ignored" in audit.stdout


async def test_audit_verify_reports_and_ignores_notes_no_trusted_key_signed(
    app: RunService, env: dict[str, str]
) -> None:
    """As documented: an unsigned or a stranger's note appended to the anchor file is reported and ignored
    by `audit verify`, which passes when the rest holds (issue 32); the same note signed by a trusted key
    counts, and then the stream it contradicts fails the audit."""
    await launch(app, "kept")
    await checkpoint(app, "kept", 10)
    home = home_anchors(env)
    facts = await app.store.facts()
    assert facts is not None
    claim = note(facts.last_seq, created="2026-06-06 06:06:06", config=facts.config, time=now())
    unsigned_at = len(read_lines(home)) + 1
    append(home, forged_line(home, claim))
    append(home, forged_line(home, claim, MALLORY))
    audit = run(env, "audit", "verify")
    assert audit.returncode == 0, audit.stdout
    assert audit.stdout.splitlines()[:2] == [
        f"ignored: anchor file {home}: line {unsigned_at} is unsigned: ignored",
        f"ignored: anchor file {home}: line {unsigned_at + 1} is signed by untrusted key "
        f"ed25519:{MALLORY.public_key[:16]}…: ignored",
    ]
    assert audit.stdout.splitlines()[-1].startswith("Verified 2 event(s) in 1 run(s): every chain intact")
    trusted = load_signer(Path(env["FTRAIN_HOME"]), "unused")  # this user's key: trusted
    append(
        home, forged_line(home, msgspec.structs.replace(claim, time=now()), trusted)
    )  # newer than the audit's
    audit = run(env, "audit", "verify")
    assert audit.returncode == 1
    assert (
        "STREAM: stream FTRAIN_EVENTS was re-created (anchored: created 2026-06-06 06:06:06" in audit.stdout
    )
