"""A broken run is never resumed: the trainer, under a real torchrun, on a broken chain stops with exit 1,
appending nothing and setting nothing aside (`status` and `list`: tests/integration/test_broken_runs.py)."""

import asyncio
from pathlib import Path

import pytest

from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.record import run_subject
from tests.integration.test_failures import files_under, raw_publish
from tests.support.processes import ftrain_process
from tests.support.servers import stream_last_seq
from tests.support.training import RESUMED, torchrun

pytestmark = pytest.mark.timeout(300)


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
