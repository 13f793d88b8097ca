"""Storage out of reach is not corruption, for the trainer under a real torchrun: its start-up stops with
exit 1, appends nothing and touches no checkpoint, and it resumes normally once the storage is back
(`ftrain resume`: tests/integration/test_storage_unavailable.py)."""

import asyncio
import os
from pathlib import Path

import pytest

from ftrain import settings
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.schema import Checkpointed, Resumed
from ftrain.service import RunService
from ftrain.workers.recorder import Recorder
from tests.support.processes import free_port, ftrain_process
from tests.support.servers import stream_last_seq
from tests.support.training import RESUMED, torchrun

pytestmark = pytest.mark.timeout(300)


async def test_trainer_with_the_storage_root_gone_exits_1_and_resumes_once_it_is_back(
    env: dict[str, str], server: ServerProcess
) -> None:
    run = "trained-1"
    assert (
        ftrain_process(
            ["launch", "proj", "--run-id", run, "--nodes", "1", "--gpus-per-node", "2"], env
        ).returncode
        == 0
    )
    storage = Path(env["FTRAIN_STORAGE"])
    ckpt = storage / run
    job_env = {**env, "FTRAIN_RUN_ID": run, "FTRAIN_CKPT_DIR": str(ckpt)}
    flags = ("--train-iters", "60", "--save-interval", "20")
    first = await asyncio.to_thread(torchrun, ckpt, *flags, kill_at="step:50", env=job_env)
    assert first.returncode != 0 and (ckpt / "step-40").is_dir(), first.stderr[-2000:]
    with Recorder(run, settings.nats(env)) as recorder:  # what the killed job left in its outbox
        assert await asyncio.to_thread(recorder.flush, 60)
    before = await stream_last_seq(server)
    os.rename(storage, storage.with_name("unmounted"))

    stopped = await asyncio.to_thread(torchrun, ckpt, *flags, env=job_env)
    assert stopped.returncode != 0, stopped.stdout
    assert "storage unavailable" in stopped.stdout + stopped.stderr
    assert "skipped" not in stopped.stdout and RESUMED.search(stopped.stdout) is None
    assert await stream_last_seq(server) == before

    offline = {**job_env, "FTRAIN_NATS_URL": f"nats://127.0.0.1:{free_port()}"}  # and the log out of reach
    blind = await asyncio.to_thread(torchrun, ckpt, *flags, env=offline)
    assert blind.returncode != 0 and "storage unavailable" in blind.stdout + blind.stderr, blind.stdout
    assert not await asyncio.to_thread(
        storage.exists
    )  # nothing recreated where the file system will be mounted again

    os.rename(storage.with_name("unmounted"), storage)
    again = await asyncio.to_thread(torchrun, ckpt, *flags, env=job_env)
    assert again.returncode == 0, again.stderr[-3000:]
    match = RESUMED.search(again.stdout)
    assert match and match.group(1) == "40"
    async with RunService.open(env) as app:
        events = [e.event for e in await app.timeline(run)]
    assert [(type(e).__name__, getattr(e, "step", None)) for e in events[1:4]] == [
        ("Checkpointed", 20), ("Checkpointed", 40), ("Resumed", 40),
    ]  # fmt: skip
    assert isinstance(events[3], Resumed) and isinstance(events[-1], Checkpointed)
