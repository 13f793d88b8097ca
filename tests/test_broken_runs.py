"""A broken run never looks healthy and is never resumed: `status` shows it BROKEN and exits 1, `list` shows
it (also one none of whose events was accepted), and the trainer stops with exit 1, setting nothing aside."""

import asyncio
import json
from pathlib import Path

import pytest

from ftrain.events.jetstream.server import ServerProcess
from ftrain.events.record import run_subject
from tests.conftest import ftrain_process, stream_last_seq
from tests.test_failures import files_under, raw_publish
from tests.training import RESUMED, torchrun

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


async def test_trainer_on_a_broken_chain_exits_1_and_sets_nothing_aside(
    env: dict[str, str], server: ServerProcess
) -> None:
    run = "broken-1"
    launched = ftrain_process(
        ["launch", "proj", "--run-id", run, "--nodes", "1", "--gpus-per-node", "2"], env
    )
    assert launched.returncode == 0, launched.stderr
    for step in ("10", "20"):
        saved = ftrain_process(
            ["checkpoint", run, "--step", step, "--epoch", "0", "--shards", "1", "--state", "{}"], env
        )
        assert saved.returncode == 0, saved.stderr
    await raw_publish(server, run_subject(run, "checkpointed"), b"forged")
    ckpt = Path(env["FTRAIN_STORAGE"]) / run
    before, files = await stream_last_seq(server), files_under(ckpt)

    job_env = {**env, "FTRAIN_RUN_ID": run, "FTRAIN_CKPT_DIR": str(ckpt)}
    job = await asyncio.to_thread(torchrun, ckpt, "--train-iters", "20", "--save-interval", "10", env=job_env)
    assert job.returncode != 0, job.stdout
    assert f"run {run}'s log is broken" in job.stdout + job.stderr
    assert RESUMED.search(job.stdout) is None and "FINAL" not in job.stdout
    assert await stream_last_seq(server) == before
    assert files_under(ckpt) == files
