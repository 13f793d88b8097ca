"""The memory tier's replicas across nodes, under real torchrun jobs: one job of 2 nodes on this machine (two
torchrun agents, `--nnodes 2`, one CPU process each, gloo, the debug model), each node with its own memory
directory, and a real nats-server. A node lost whole (every process of it SIGKILLed once a snapshot newer
than the last durable checkpoint is recorded, its memory removed) comes back from the replica its peer
node holds (the node replaced: the scheduler gives another host its node rank, with memory of its own):
the resume names the `peer` tier, loses at most `memory_every` steps, and the job ends
bit-identical to an uninterrupted one; every snapshot's log names both nodes' parts and the end of its
replica exchange. A slow link to the peer (every exchange of replicas delayed on one
node) never holds the training loop: the snapshots due meanwhile are skipped on every rank, taken again once
the exchange ends, and a job killed after them resumes from the newest, bit-identical too."""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from ftrain.events.schema import (
    HOST_MAX,
    AnyEvent,
    CorruptSkipped,
    PartReplicas,
    Resumed,
    SnapshotPart,
    SnapshotReplicated,
    Snapshotted,
)
from tests.e2e.test_memory_tier import EVERY, FLAGS, KILLED, events_of, job_env, slowed
from tests.support.processes import free_port
from tests.support.training import final_digest, metrics, resumed_step, torchrun_env

pytestmark = pytest.mark.timeout(600)
NODES = 2
SLOW_LINK = 4.0
"""Seconds node 1's ranks wait before each exchange of replicas: several snapshot intervals of slowed steps."""


def node_command(program: Sequence[str], node: int, port: int) -> list[str]:
    """argv of node `node`'s agent of a 2-node job of `program` (a module and its arguments), one process to
    the node."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank", str(node),
        "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", *program,
    ]  # fmt: skip


def reference_trainer(ckpt: Path) -> list[str]:
    return ["ftrain.examples.train", "--ckpt-dir", str(ckpt), *FLAGS]


def two_nodes(
    ckpt: Path,
    env: dict[str, str],
    memory: list[Path],
    kill_at: str | None = None,
    node1: dict[str, str] | None = None,
    program: Sequence[str] | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """One job of 2 nodes of `program` (a module and its arguments; the reference trainer by default), node
    `n` with the memory directory `memory[n]` (static rendezvous: node `n` holds rank `n`), node 1 given
    `node1` besides (a slow link), waiting for both to end; once node 0 ends, node 1 is given 60 s, then
    SIGKILLed (its peer gone, it may wait on the rendezvous' store)."""
    port = free_port()
    given: list[dict[str, str]] = [{}, node1 or {}]
    nodes = [
        subprocess.Popen(
            node_command(program or reference_trainer(ckpt), n, port),
            env={**torchrun_env(env, kill_at), "FTRAIN_MEMORY_DIR": str(memory[n]), **given[n]},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for n in range(NODES)
    ]
    first = nodes[0].communicate(timeout=240)
    try:
        second = nodes[1].communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(nodes[1].pid, signal.SIGKILL)
        second = nodes[1].communicate()
    return [
        subprocess.CompletedProcess(node.args, node.returncode, out, err)
        for node, (out, err) in zip(nodes, (first, second), strict=True)
    ]


def node_memories(tmp_path: Path) -> list[Path]:
    """Each node's memory directory, made private and empty."""
    memory = [tmp_path / f"shm-node{n}" for n in range(NODES)]
    for path in memory:
        path.mkdir(mode=0o700)
    return memory


def sealed(memory: Path, part: str) -> list[str]:
    """The steps of which `part` (`rank-<r>`, `replica-<r>`) is sealed under a node's memory directory."""
    return sorted(p.parent.parent.name for p in memory.glob(f"ftrain-*/*/step-*/{part}/.complete"))


async def test_a_node_lost_whole_resumes_from_its_peers_replica_bit_identical(
    tmp_path: Path, env: dict[str, str]
) -> None:
    memory = node_memories(tmp_path)

    ckpt, job = job_env("replica-reference", env, memory[0])
    reference = await asyncio.to_thread(two_nodes, ckpt, job, memory)
    digest = final_digest(reference[0])
    assert [sealed(m, "*") for m in memory] == [[], []], (
        "a completed run's snapshots and replicas are removed"
    )
    recorded, _ = await events_of(env, "replica-reference")
    assert_replicas_recorded(recorded)

    # node 0 (rank 0) SIGKILLed once snapshot 35 is recorded and replicated: newer than the durable step 20
    ckpt, job = job_env("replica-kill", env, memory[0])
    killed = await asyncio.to_thread(two_nodes, ckpt, slowed(job), memory, "snapshot:35")
    assert killed[0].returncode == KILLED, killed[0].stderr[-3000:]
    assert sealed(memory[1], "rank-1") == sealed(memory[1], "replica-0") == ["step-35"], "the newest kept"
    assert sealed(memory[0], "replica-1") == ["step-35"]
    shutil.rmtree(memory[0])  # the node lost whole: its memory with it; a replacement takes its node rank,
    memory[0] = tmp_path / "shm-replacement"  # on another host: its own memory, another path, empty
    memory[0].mkdir(mode=0o700)

    started = time.monotonic()
    resumed = await asyncio.to_thread(two_nodes, ckpt, job, memory)
    print(f"2-node resume from the peer's replica: {time.monotonic() - started:.1f} s wall")
    assert resumed_step(resumed[0]) == 35 and ", from peer" in resumed[0].stdout, resumed[0].stdout
    assert final_digest(resumed[0]) == digest
    events, lost = await events_of(env, "replica-kill")
    assert list(lost) == ["peer"] and 0 <= lost["peer"] <= EVERY, "at most memory_every steps trained again"
    last = [e for e in events if isinstance(e, Resumed)][-1]
    assert (last.tier, last.step) == ("peer", 35)
    assert not any(isinstance(e, CorruptSkipped) for e in events)


def assert_replicas_recorded(events: list[AnyEvent | None]) -> None:
    """Each snapshot names both nodes' parts (rank `n` on node `n`, its replica on the other), and rank 0
    recorded the end of its exchange once, every replica landed."""
    host = socket.gethostname()[:HOST_MAX]
    parts = tuple(
        SnapshotPart(node=n, host=host, first_rank=n, ranks=1, size_bytes=0, replica_node=1 - n)
        for n in (0, 1)
    )
    snapshots = [e for e in events if isinstance(e, Snapshotted)]
    assert snapshots
    for snapshot in snapshots:
        assert isinstance(snapshot.parts, tuple)
        assert [msgspec.structs.replace(p, size_bytes=0) for p in snapshot.parts] == list(parts)
        assert sum(p.size_bytes for p in snapshot.parts) == snapshot.size_bytes
    ended = {e.snapshot_seq: e for e in events if isinstance(e, SnapshotReplicated)}
    assert sorted(ended) == [s.seq for s in snapshots]
    landed = (PartReplicas(node=0, landed=1), PartReplicas(node=1, landed=1))
    assert all(e.replicas == landed and e.actor is not None and e.actor.rank == 0 for e in ended.values())


def skipped_snapshots(result: subprocess.CompletedProcess[str]) -> list[int]:
    """The steps rank 0 logged as `memory_snapshot_skipped` (its structlog lines on stderr, JSON)."""
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    return [line["step"] for line in lines if line.get("event") == "memory_snapshot_skipped"]


def held(ckpt: Path, steps: list[int]) -> list[float]:
    """How long rank 0's loop was held after each of `steps` (its first attempt's): from that step's metrics
    line to the next step's, less the next step's own compute."""
    lines = {m["train/iter"]: m for m in metrics(ckpt) if "train/dt" in m}  # read before any resume
    return [lines[s + 1]["time"] - lines[s]["time"] - lines[s + 1]["train/dt"] for s in steps]


async def test_a_slow_peer_skips_snapshots_never_holds_training_and_the_resume_is_bit_identical(
    tmp_path: Path, env: dict[str, str]
) -> None:
    memory = node_memories(tmp_path)
    ckpt, job = job_env("slow-peer-reference", env, memory[0])
    digest = final_digest((await asyncio.to_thread(two_nodes, ckpt, job, memory))[0])

    # node 1's link slow: each exchange of replicas takes SLOW_LINK s, some 3 snapshot intervals; killed
    # at step 33, past the durable step 20 and a snapshot taken after the skips
    slow = {"FTRAIN_REPLICA_DELAY": str(SLOW_LINK)}
    ckpt, job = job_env("slow-peer", env, memory[0])
    killed = await asyncio.to_thread(two_nodes, ckpt, slowed(job), memory, "step:33", slow)
    assert killed[0].returncode == KILLED, killed[0].stderr[-3000:]
    due = [step for step in range(EVERY, 33, EVERY) if step != 20]  # 20: a durable save, no snapshot
    hold = held(ckpt, due)
    assert max(hold) < SLOW_LINK / 4, f"the loop never waits on the exchange: {hold}"
    resumed = await asyncio.to_thread(two_nodes, ckpt, job, memory, None, slow)
    assert final_digest(resumed[0]) == digest

    events, _ = await events_of(env, "slow-peer")
    snapshots = [e for e in events if isinstance(e, Snapshotted)]
    taken = sorted(e.step for e in snapshots if e.attempt == snapshots[0].attempt)
    skipped = skipped_snapshots(killed[0])
    print(f"slow peer: snapshots taken {taken}, skipped {skipped}; the loop held {max(hold):.2f} s at most")
    assert taken[0] == 5 and 10 in skipped, (taken, skipped)
    assert any(step > 20 for step in taken), f"taken again once the exchange ended: {taken}, {skipped}"
    assert sorted(taken + skipped) == due, "each due snapshot taken or skipped"
    last = [e for e in events if isinstance(e, Resumed)][-1]
    assert (last.tier, last.step) == ("memory", taken[-1])
