"""The memory tier under real torchrun jobs (2 ranks, CPU, gloo, the debug model) and a real nats-server: a
job killed after a memory snapshot newer than its last durable checkpoint resumes from memory, losing at
most `memory_every` steps, and ends bit-identical to an uninterrupted run; a corrupted snapshot is skipped,
recorded against its tier, and the job resumes from durable storage, bit-identical too."""

import asyncio
import signal
from pathlib import Path

import msgspec
import pytest

from ftrain.events.schema import Checkpointed, CorruptSkipped, Resumed, Snapshotted
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


async def events_of(env: dict[str, str], run_id: str) -> list[object]:
    async with RunService.open(env) as app:
        return [entry.event for entry in await app.timeline(run_id)]


def snapshots(memory: Path) -> list[Path]:
    """Every rank's sealed part of every snapshot under a user's memory directory."""
    return sorted(memory.glob("ftrain-*/*/step-*/rank-*/.complete"))


async def test_a_killed_job_resumes_from_memory_and_a_corrupt_snapshot_falls_back_to_durable(
    tmp_path: Path, env: dict[str, str]
) -> None:
    memory = tmp_path / "shm"
    memory.mkdir(mode=0o700)

    ckpt, uninterrupted = job_env("mem-reference", env, memory)
    reference = final_digest(await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=uninterrupted))
    assert snapshots(memory) == [], "a completed run's snapshots are removed"

    # killed once snapshot 35 is recorded: newer than the durable step 20, within EVERY steps of the kill
    ckpt, killed_env = job_env("mem-kill", env, memory)
    first = await asyncio.to_thread(torchrun, ckpt, *FLAGS, kill_at="snapshot:35", env=killed_env)
    assert first.returncode == KILLED, first.stderr[-3000:]
    assert [p.parent.parent.name for p in snapshots(memory)] == ["step-35", "step-35"], "the newest kept"
    second = await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=killed_env)
    assert resumed_step(second) == 35 and ", from memory" in second.stdout, second.stdout
    assert final_digest(second) == reference
    events = await events_of(env, "mem-kill")
    resumed = [e for e in events if isinstance(e, Resumed)]
    assert resumed[-1].tier == "memory" and resumed[-1].step == 35
    assert not any(isinstance(e, CorruptSkipped) for e in events)
    steps = [e.step for e in events if isinstance(e, Snapshotted)]
    assert steps[:6] == [5, 10, 15, 25, 30, 35], "no snapshot where a durable save is due"
    assert [e.step for e in events if isinstance(e, Checkpointed)] == [20, 40]

    # the same kill, then one byte of rank 1's snapshot flipped: skipped, recorded, resumed from step 20
    ckpt, corrupt_env = job_env("mem-corrupt", env, memory)
    third = await asyncio.to_thread(torchrun, ckpt, *FLAGS, kill_at="snapshot:35", env=corrupt_env)
    assert third.returncode == KILLED, third.stderr[-3000:]
    root = next(p for p in memory.glob("ftrain-*/*") if p.name.startswith("mem-corrupt"))
    assert root == memory_root(memory, root.name)
    flip(root / "step-35" / "rank-1" / "__0_0.distcp")
    fourth = await asyncio.to_thread(torchrun, ckpt, *FLAGS, env=corrupt_env)
    assert resumed_step(fourth) == 20, fourth.stdout
    assert "checkpoint step 35 (memory) file __0_0.distcp hash mismatch → skipped" in fourth.stdout
    assert final_digest(fourth) == reference
    events = await events_of(env, "mem-corrupt")
    skipped = [e for e in events if isinstance(e, CorruptSkipped)]
    assert [(e.tier, e.step) for e in skipped] == [("memory", 35)]
    resumed = [e for e in events if isinstance(e, Resumed)]
    assert resumed[-1].step == 20 and resumed[-1].tier is msgspec.UNSET
