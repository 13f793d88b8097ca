"""The memory tier resumed on another world, under real torchrun jobs: a job of 2 nodes (one rank to a node,
each node with its own memory directory, the elastic example: a global batch and data position, so it trains
alike on any world) killed once a snapshot newer than its last durable checkpoint is recorded and replicated,
then resumed on node 0 alone, which holds rank 0's part and rank 1's replica. As 1 node of 1 rank, DCP
reshards both parts into the one rank; as 1 node of 2 ranks, rank 1 loads its replica. Either resume names
the `memory` tier and loses at most `memory_every` steps, and the job trains every step's samples as an
uninterrupted run does, its final parameters equal to that run's (within the float summation order, as the
durable elastic resume: tests/e2e/test_data_position.py)."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from ftrain.events.schema import CorruptSkipped, Resumed
from tests.e2e.test_data_position import TOLERANCE, _params, _trained
from tests.e2e.test_memory_replica import node_memories, sealed, two_nodes
from tests.e2e.test_memory_tier import KILLED, events_of, job_env, slowed
from tests.support.processes import free_port
from tests.support.training import resumed_step, torchrun_env

pytestmark = pytest.mark.timeout(600)
STEPS, EVERY, SNAPSHOT = 12, 3, 6
"""The job's steps (durable saves every 4: at 4, 8, 12), its memory snapshots' cadence, and the snapshot after
which it is killed: newer than the durable step 4."""


def elastic(ckpt: Path, record: Path) -> list[str]:
    """The elastic example's module and arguments, writing what it trained under `record`."""
    record.mkdir()
    return [
        "ftrain.examples.elastic",
        "--location",
        str(ckpt),
        "--steps",
        str(STEPS),
        "--record",
        str(record),
    ]


def one_node(program: list[str], nproc: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A job of 1 node of `nproc` ranks, waiting for it to end."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", *program,
    ]  # fmt: skip
    return subprocess.run(
        command, env=torchrun_env(env), capture_output=True, text=True, timeout=240, start_new_session=True
    )


@pytest.mark.parametrize("nproc", [1, 2], ids=["resharded-to-1-rank", "2-ranks-on-1-node"])
async def test_a_2_node_job_resumes_on_1_node_from_memory_training_as_if_uninterrupted(
    tmp_path: Path, env: dict[str, str], nproc: int
) -> None:
    memory = node_memories(tmp_path)
    memory_env = {"FTRAIN_MEMORY_EVERY": str(EVERY)}
    (tmp_path / "shm-reference").mkdir(mode=0o700)  # the example's last save is no final one: snapshots stay
    ckpt, job = job_env("reshard-reference", {**env, **memory_env}, tmp_path / "shm-reference")
    done = await asyncio.to_thread(one_node, elastic(ckpt, tmp_path / "uninterrupted"), 2, job)
    assert done.returncode == 0, done.stderr[-3000:]

    run = f"reshard-{nproc}"
    ckpt, job = job_env(run, {**env, **memory_env}, memory[0])
    killed = await asyncio.to_thread(
        two_nodes, ckpt, slowed(job), memory, f"snapshot:{SNAPSHOT}", None, elastic(ckpt, tmp_path / "killed")
    )
    assert killed[0].returncode == KILLED, killed[0].stderr[-3000:]
    assert sealed(memory[0], "rank-0") == sealed(memory[0], "replica-1") == [f"step-{SNAPSHOT}"]

    resumed = await asyncio.to_thread(one_node, elastic(ckpt, tmp_path / "resumed"), nproc, job)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed_step(resumed) == SNAPSHOT and ", from memory" in resumed.stdout, resumed.stdout
    events, _ = await events_of(env, run)
    last = [e for e in events if isinstance(e, Resumed)][-1]
    assert (last.tier, last.step, last.saved_world, last.world) == ("memory", SNAPSHOT, 2, nproc)
    assert not any(isinstance(e, CorruptSkipped) for e in events)

    expected, _ = _trained(tmp_path / "uninterrupted")
    before, _ = _trained(tmp_path / "killed")
    after, worlds = _trained(tmp_path / "resumed")
    trained = {**{s: ids for s, ids in before.items() if s <= SNAPSHOT}, **after}
    assert 0 <= max(before) - SNAPSHOT <= EVERY, "at most memory_every steps trained again"
    assert sorted(after) == list(range(SNAPSHOT + 1, STEPS + 1)) and set(worlds.values()) == {nproc}
    assert trained == expected, "every step trained the uninterrupted run's samples"
    difference = max(
        (a - b).abs().max().item()
        for a, b in zip(_params(tmp_path / "resumed"), _params(tmp_path / "uninterrupted"), strict=True)
    )
    assert difference <= TOLERANCE
