"""A broken run never looks healthy: `status` shows it BROKEN and exits 1, `list` shows it (also one none of
whose events was accepted); the trainer on a broken chain: tests/e2e/test_broken_runs.py."""

import asyncio
import json

import pytest

from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.record import run_subject
from tests.integration.test_failures import raw_publish
from tests.support.processes import ftrain_process

pytestmark = pytest.mark.timeout(300)


async def test_status_and_list_show_broken_runs_and_status_exits_1(
    env: dict[str, str], server: ServerProcess
) -> None:
    launched = ftrain_process(
        ["launch", "proj", "--run-id", "r1", "--nodes", "1", "--gpus-per-node", "1"], env
    )
    assert launched.returncode == 0, launched.stderr
    bad = await raw_publish(server, run_subject("r1", "failed"), b"not an event")
    ghost = await raw_publish(server, run_subject("ghost", "launched"), b"not an event either")

    for run, seq in (("r1", bad), ("ghost", ghost)):
        status = await asyncio.to_thread(ftrain_process, ["status", run], env)
        assert status.returncode == 1, status.stderr
        first = status.stdout.splitlines()[0]
        assert first.startswith(f"BROKEN run {run}: ") and f"stream seq {seq}" in first, status.stdout
        as_json = json.loads((await asyncio.to_thread(ftrain_process, ["status", run, "--json"], env)).stdout)
        assert as_json["state"] == "broken" and as_json["broken"]["stream_seq"] == seq

    listed = await asyncio.to_thread(ftrain_process, ["list"], env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[2] for line in listed.stdout.splitlines()[1:]}
    assert rows == {"ghost": "BROKEN", "r1": "BROKEN"}
    docs = json.loads((await asyncio.to_thread(ftrain_process, ["list", "--json"], env)).stdout)
    assert [(d["run_id"], d["state"], d["broken"]["stream_seq"]) for d in docs] == [
        ("ghost", "broken", ghost),
        ("r1", "broken", bad),
    ]
