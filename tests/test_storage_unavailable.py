"""Storage out of reach is not corruption: `ftrain resume` and the trainer's start-up stop with exit 1,
append nothing and touch no checkpoint, and resume normally once the storage is back."""

import asyncio
import errno
import os
from pathlib import Path

import pytest

from ftrain import settings
from ftrain.events.jetstream.server import ServerProcess
from ftrain.events.schema import Checkpointed, Resumed
from ftrain.service import RunService
from ftrain.workers.checkpoint_dir import (
    StorageUnavailable,
    file_verdict,
    verify_checkpoint,
    write_checkpoint,
)
from ftrain.workers.integrity import digest_of
from ftrain.workers.manifest import FileEntry
from ftrain.workers.recorder import Recorder
from tests.conftest import free_port, ftrain_process, stream_last_seq
from tests.test_failures import files_under
from tests.training import RESUMED, torchrun

pytestmark = pytest.mark.timeout(300)


def test_only_absence_under_a_listable_directory_or_wrong_bytes_are_corrupt(tmp_path: Path) -> None:
    written = write_checkpoint(
        tmp_path / "root", run_id="r", step=10, epoch=0, shards=1, sources=[("a.bin", b"abc")]
    )
    (written.path / "a.bin").unlink()
    assert verify_checkpoint(written.path, written.checkpoint_hash) == "file a.bin missing"
    written.path.rename(written.path.with_name("elsewhere"))
    assert verify_checkpoint(written.path, written.checkpoint_hash) == "directory missing"
    (tmp_path / "root").rename(tmp_path / "unmounted")
    with pytest.raises(StorageUnavailable, match="storage unavailable"):
        verify_checkpoint(written.path, written.checkpoint_hash)
    entry = FileEntry("a.bin", 3, digest_of(b"abc"))
    for code in (errno.EIO, errno.EACCES, errno.ESTALE, errno.ETIMEDOUT):
        with pytest.raises(StorageUnavailable):
            file_verdict(tmp_path, entry, OSError(code, "injected"))


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


@pytest.mark.slow
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
