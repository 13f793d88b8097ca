"""`list` and `cost` judge trust as `status` does, through the real CLI against a real nats-server: a run whose
newest events no trusted writer vouches for shows as broken, naming why, and its hours are not added to the
total; the verdict follows the trust list of the moment (a key revoked after the fold counts as revoked);
the read model's signers rebuild identically, and a model from before them is replayed on open."""

import asyncio
import json
import sqlite3
import subprocess
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ftrain import settings
from ftrain.domain.lifecycle import completed_event
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.schema import now
from ftrain.events.signing import Signature, Signer
from ftrain.service import RunService
from ftrain.service.run_queries import readmodel_path
from tests.integration.test_trust import forge
from tests.support.builders import SIGNER
from tests.support.processes import ftrain_process
from tests.support.runs import checkpoint, launch

FORGED_HOURS = 9999.0


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(ftrain_process, list(args), env)


async def ok_json(env: dict[str, str], *args: str) -> Any:
    done = await cli(env, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def own_key(app: RunService) -> str:
    [key] = [k for k, name in app.store.trust.trusted.items() if name == SIGNER]
    return key


async def honest_and_forged(app: RunService, server: ServerProcess, forger: str) -> str:
    """honest: launched, checkpointed, completed with 1.5 GPU-hours; victim: launched and checkpointed, then
    a correctly chained `completed` with FORGED_HOURS appended by `forger`. Returns why it is unvouched."""
    for run_id in ("honest", "victim"):
        await launch(app, run_id)
        await checkpoint(app, run_id, 10)
    await app.complete("honest", cost_gpu_hours=1.5)
    state = await app.state_of("victim")
    mallory = Signer(Ed25519PrivateKey.generate())
    signer = {
        "nobody": None,
        "mallory": mallory,
        "a bad signature claiming the owner's key": _Claiming(own_key(app), mallory),
    }[forger]
    await forge(server, state, completed_event(state, FORGED_HOURS, now()), signer)  # type: ignore[arg-type]
    return {
        "nobody": "unsigned",
        "mallory": f"signed by untrusted key ed25519:{mallory.public_key[:16]}…",
        "a bad signature claiming the owner's key": f"its signature, claiming {SIGNER} (ed25519:",
    }[forger]


class _Claiming:
    """Signs with Mallory's key but names `key` as the signer: a signature that must not verify."""

    def __init__(self, key: str, mallory: Signer) -> None:
        self.key, self.mallory = key, mallory

    def sign_hash(self, chain_hash: str) -> Signature:
        return Signature(self.key, self.mallory.sign_hash(chain_hash).sig)


@pytest.mark.parametrize("forger", ["nobody", "mallory", "a bad signature claiming the owner's key"])
async def test_a_forged_completion_is_broken_in_list_and_cost_and_its_hours_are_not_counted(
    app: RunService, env: dict[str, str], server: ServerProcess, forger: str
) -> None:
    why = await honest_and_forged(app, server, forger)
    docs = {d["run_id"]: d for d in await ok_json(env, "list")}
    victim, honest = docs["victim"], docs["honest"]
    assert (victim["state"], victim["vouched"], victim["signed_by"]) == ("broken", False, None)
    assert victim["broken"]["seq"] == 3 and victim["broken"]["event_type"] == "completed"
    assert victim["broken"]["reason"].startswith(why), victim["broken"]
    assert (honest["state"], honest["broken"], honest["vouched"], honest["signed_by"]) == (
        "completed", None, True, SIGNER)  # fmt: skip
    status = await ok_json_status(env, "victim")
    assert status["broken"] == victim["broken"] and status["vouched"] is False

    listed = (await cli(env, "list")).stdout.splitlines()
    assert listed[0].split()[-2:] == ["SIGNED", "BY"]
    rows = {line.split()[0]: line.split() for line in listed[1:]}
    assert rows["victim"][2] == "BROKEN" and rows["victim"][-1] == "UNVOUCHED"
    assert rows["honest"][2] == "completed" and rows["honest"][-1] == SIGNER

    cost = await ok_json(env, "cost")
    assert (cost["total_gpu_hours"], cost["uncounted_gpu_hours"]) == (1.5, FORGED_HOURS)
    by_run = {r["run_id"]: r for r in cost["runs"]}
    assert (by_run["victim"]["state"], by_run["victim"]["vouched"]) == ("broken", False)
    assert by_run["victim"]["broken"] == victim["broken"] and by_run["honest"]["broken"] is None
    text = (await cli(env, "cost")).stdout.splitlines()
    assert text[-1] == (
        "total 1.50 GPU-hours over 1 run(s); not counted: 9999.00 GPU-hours of 1 broken or unvouched run(s)"
    )


async def ok_json_status(env: dict[str, str], run_id: str) -> Any:
    done = await cli(env, "status", run_id, "--json")
    assert done.returncode == 1, done.stderr  # broken: exit 1
    return json.loads(done.stdout)


async def test_the_verdict_follows_the_trust_list_of_the_moment(app: RunService, env: dict[str, str]) -> None:
    await launch(app, "r1")
    await checkpoint(app, "r1", 10)
    key = own_key(app)
    assert [(d["state"], d["signed_by"]) for d in await ok_json(env, "list")] == [("running", SIGNER)]
    assert (await cli(env, "keys", "revoke", SIGNER)).returncode == 0  # no event since: the fold is done
    [doc] = await ok_json(env, "list")
    assert (doc["state"], doc["vouched"]) == ("broken", False)
    assert doc["broken"]["reason"] == f"signed by revoked key ed25519:{key[:16]}… ({SIGNER})"
    assert (await ok_json(env, "cost"))["total_gpu_hours"] == 0
    assert (await cli(env, "keys", "trust", SIGNER, f"ed25519:{key}")).returncode == 0
    [doc] = await ok_json(env, "list")
    assert (doc["state"], doc["broken"], doc["signed_by"]) == ("running", None, SIGNER)


async def test_signers_rebuild_identically(app: RunService, server: ServerProcess) -> None:
    await honest_and_forged(app, server, "nobody")
    await app.views()  # caught up, signatures checked
    incremental = await app.model.dump()
    assert [row[:2] for row in incremental["signers"]] == [("honest", 0), ("victim", 0), ("victim", 1)]
    assert [row[3] for row in incremental["signers"]] == [1, 1, 0]  # checked once caught up
    await app.rebuild()
    assert await app.model.dump() == incremental


async def test_a_model_from_before_signers_is_replayed_on_open(
    app: RunService, env: dict[str, str], server: ServerProcess
) -> None:
    await honest_and_forged(app, server, "nobody")
    assert (await cli(env, "list")).returncode == 0
    older = sqlite3.connect(readmodel_path(settings.nats(env)))
    # the file as an older ftrain left it: no signers, no schema version
    older.executescript("DROP TABLE IF EXISTS signers; PRAGMA user_version = 0;")
    older.close()
    docs = {d["run_id"]: d for d in await ok_json(env, "list")}
    assert (docs["victim"]["state"], docs["victim"]["broken"]["reason"]) == ("broken", "unsigned")
    assert docs["honest"]["signed_by"] == SIGNER
