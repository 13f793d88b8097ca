"""The memory tier under real torchrun jobs (2 ranks, CPU, gloo, the debug model) and a real nats-server: a
job killed after a memory snapshot newer than its last durable checkpoint resumes from memory, losing at
most `memory_every` steps, and ends bit-identical to an uninterrupted run; a corrupted snapshot is skipped,
recorded against its tier, and the job resumes from durable storage, bit-identical too; so does a job one of
whose ranks lacks its part, with nothing recorded against the snapshot. A job killed between a snapshot's
seal and its record resumes from the snapshot before it, which every rank still holds."""

import asyncio
import shutil
import signal
from pathlib import Path

import msgspec
import pytest

from ftrain.events.schema import AnyEvent, Checkpointed, CorruptSkipped, Resumed, Snapshotted
from ftrain.service import RunService
from ftrain.workers.memory_tier import memory_root
from tests.e2e.test_training import flip
from tests.support.training import final_digest, launch_logged, resumed_step, torchrun

pytestmark = pytest.mark.timeout(600)
EVERY = 5
FLAGS = ("--train-iters", "40", "--save-interval", "20", "--memory-every", str(EVERY))
KILLED = -signal.SIGKILL


def job_env(run_id: str, env: dict[str, str], memory: Path) -> tuple[Path, dict[str, str]]:
    ckpt, logged = launch_logged(run_id, env)
    return ckpt, {**logged, "FTRAIN_MEMORY_DIR": str(memory)}


def slowed(env: dict[str, str]) -> dict[str, str]:
    """`env` with every step slowed to 0.2 s: a snapshot of the debug model lands well within EVERY steps
    however loaded the machine, as it would behind a real model's steps."""
    return {**env, "FTRAIN_STEP_DELAY": "0.2"}


async def events_of(env: dict[str, str], run_id: str) -> tuple[list[AnyEvent | None], dict[str, int]]:
    """The run's events, and the steps its goodput counts as lost by the tier each resume loaded from."""
    async with RunService.open(env) as app:
        events = [entry.event for entry in await app.timeline(run_id)]
        goodput = await app.goodput(run_id)
    return events, goodput.lost_by_tier


def snapshots(memory: Path) -> list[Path]:
    """Every rank's sealed part of every snapshot under a user's memory directory."""
    return sorted(memory.glob("ftrain-*/*/step-*/rank-*/.complete"))


async def test_a_killed_job_resumes_from_memory_and_a_corrupt_or_missing_snapshot_falls_back_to_durable(
    tmp_path: Path, env: dict[str, str]
) -> None:
    memory = tmp_path / "shm"
    memory.mkdir(mode=0o700)

    ckpt, uninterrupted = job_env("mem-reference", env, memory)
    reference = final_digest(await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=uninterrupted))
    assert snapshots(memory) == [], "a completed run's snapshots are removed"

    # killed once snapshot 35 is recorded: newer than the durable step 20, within EVERY steps of the kill
    ckpt, killed_env, _ = await asyncio.to_thread(killed_after_snapshot, "mem-kill", env, memory)
    assert [p.parent.parent.name for p in snapshots(memory)] == ["step-35", "step-35"], "the newest kept"
    second = await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=killed_env)
    assert resumed_step(second) == 35 and ", from memory" in second.stdout, second.stdout
    assert final_digest(second) == reference
    events, lost = await events_of(env, "mem-kill")
    assert list(lost) == ["memory"] and 0 <= lost["memory"] <= EVERY, (
        "at most memory_every steps trained again"
    )
    resumed = [e for e in events if isinstance(e, Resumed)]
    assert resumed[-1].tier == "memory" and resumed[-1].step == 35
    assert not any(isinstance(e, CorruptSkipped) for e in events)
    steps = [e.step for e in events if isinstance(e, Snapshotted)]
    assert steps[:6] == [5, 10, 15, 25, 30, 35], "no snapshot where a durable save is due"
    assert [e.step for e in events if isinstance(e, Checkpointed)] == [20, 40]

    # the same kill, then one byte of rank 1's snapshot flipped: skipped, recorded, resumed from step 20
    ckpt, corrupt_env, root = await asyncio.to_thread(killed_after_snapshot, "mem-corrupt", env, memory)
    flip(root / "step-35" / "rank-1" / "__0_0.distcp")
    fourth = await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=corrupt_env)
    assert resumed_step(fourth) == 20, fourth.stdout
    assert "checkpoint step 35 (memory) file __0_0.distcp hash mismatch → skipped" in fourth.stdout
    assert final_digest(fourth) == reference
    events, lost = await events_of(env, "mem-corrupt")
    assert list(lost) == ["durable"] and 15 <= lost["durable"] <= 15 + EVERY, "trained again from step 20"
    skipped = [e for e in events if isinstance(e, CorruptSkipped)]
    assert [(e.tier, e.step) for e in skipped] == [("memory", 35)]
    resumed = [e for e in events if isinstance(e, Resumed)]
    assert resumed[-1].step == 20 and resumed[-1].tier is msgspec.UNSET

    # the same kill, then rank 0's part gone (as a node's memory would be): every rank resumes from durable
    # storage, and nothing is recorded against the snapshot: it is unavailable, not corrupt
    ckpt, gone_env, root = await asyncio.to_thread(killed_after_snapshot, "mem-gone", env, memory)
    shutil.rmtree(root / "step-35" / "rank-0")
    fifth = await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=gone_env)
    assert resumed_step(fifth) == 20 and "memory snapshot step 35 unavailable" in fifth.stdout, fifth.stdout
    assert final_digest(fifth) == reference
    events, _ = await events_of(env, "mem-gone")
    assert not any(isinstance(e, CorruptSkipped) for e in events)

    # killed once every rank sealed snapshot 35, before rank 0 recorded it: the log still names snapshot 30,
    # which no rank may drop until 35 is recorded, so the job resumes from memory at 30 (a rank that dropped
    # it on sealing 35 sent the resume to durable storage: seen once in the restart experiment)
    ckpt, unrecorded_env, root = await asyncio.to_thread(
        killed_after_snapshot, "mem-unrecorded", env, memory, "snapshot_sealed"
    )
    held = sorted("/".join(p.relative_to(root).parts[:2]) for p in root.glob("step-*/rank-*/.complete"))
    assert held == ["step-30/rank-0", "step-30/rank-1", "step-35/rank-0", "step-35/rank-1"], "none dropped"
    sixth = await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=unrecorded_env)
    assert resumed_step(sixth) == 30 and ", from memory" in sixth.stdout, sixth.stdout
    assert final_digest(sixth) == reference
    events, _ = await events_of(env, "mem-unrecorded")
    assert [e.step for e in events if isinstance(e, Snapshotted)][:5] == [5, 10, 15, 25, 30]
    assert [(e.tier, e.step) for e in events if isinstance(e, Resumed)] == [("memory", 30)]


def killed_after_snapshot(
    run_id: str, env: dict[str, str], memory: Path, point: str = "snapshot"
) -> tuple[Path, dict[str, str], Path]:
    """A run killed at `point` of its snapshot of step 35 (`snapshot`: recorded): its checkpoints, its jobs'
    environment, and its snapshots' directory on this node."""
    ckpt, job = job_env(run_id, env, memory)
    killed = torchrun(ckpt, *FLAGS, kill_at=f"{point}:35", env=slowed(job))
    assert killed.returncode == KILLED, killed.stderr[-3000:]
    root = next(p for p in memory.glob("ftrain-*/*") if p.name.startswith(run_id))
    assert root == memory_root(memory, root.name)
    return ckpt, job, root
