"""Storage out of reach is not corruption: `ftrain resume` stops with exit 1, appends nothing and touches no
checkpoint, and resumes normally once the storage is back (the trainer's start-up, under torchrun:
tests/e2e/test_storage_unavailable.py)."""

import os
from pathlib import Path

import pytest

from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.service import RunService
from tests.integration.test_failures import files_under
from tests.support.processes import ftrain_process
from tests.support.servers import stream_last_seq

pytestmark = pytest.mark.timeout(300)


async def test_resume_with_the_storage_root_gone_exits_1_appends_nothing_and_works_once_it_is_back(
    env: dict[str, str], server: ServerProcess
) -> None:
    storage = Path(env["FTRAIN_STORAGE"])
    assert (
        ftrain_process(
            ["launch", "proj", "--run-id", "r1", "--nodes", "1", "--gpus-per-node", "1"], env
        ).returncode
        == 0
    )
    saved = ftrain_process(
        ["checkpoint", "r1", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}"], env
    )
    assert saved.returncode == 0, saved.stderr
    assert ftrain_process(["fail", "r1"], env).returncode == 0
    before, files = await stream_last_seq(server), files_under(storage)
    os.rename(storage, storage.with_name("unmounted"))

    refused = ftrain_process(["resume", "r1"], env)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "storage unavailable" in refused.stderr, refused.stderr
    assert await stream_last_seq(server) == before

    os.rename(storage.with_name("unmounted"), storage)
    assert files_under(storage) == files
    resumed = ftrain_process(["resume", "r1"], env)
    assert resumed.returncode == 0, resumed.stderr
    async with RunService.open(env) as app:
        events = [e.event for e in await app.timeline("r1")]
    assert [type(e).__name__ for e in events][-1] == "Resumed"
    assert not any(type(e).__name__ == "CorruptSkipped" for e in events)
