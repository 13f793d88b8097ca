"""The memory tier's replicas across nodes, under real torchrun jobs: one job of 2 nodes on this machine (two
torchrun agents, `--nnodes 2`, one CPU process each, gloo, the debug model), each node with its own memory
directory, and a real nats-server. A node lost whole (every process of it SIGKILLed once a snapshot newer
than the last durable checkpoint is recorded, its memory removed) comes back from the replica its peer
node holds: the resume names the `peer` tier, loses at most `memory_every` steps, and the job ends
bit-identical to an uninterrupted one."""

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftrain.events.schema import CorruptSkipped, Resumed
from tests.e2e.test_memory_tier import EVERY, FLAGS, KILLED, events_of, job_env, slowed
from tests.support.processes import free_port
from tests.support.training import final_digest, resumed_step, torchrun_env

pytestmark = pytest.mark.timeout(600)
NODES = 2


def node_command(ckpt: Path, node: int, port: int) -> list[str]:
    """argv of node `node`'s agent of a 2-node job of the reference trainer, one process to the node."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank", str(node),
        "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
        "-m", "ftrain.examples.train", "--ckpt-dir", str(ckpt), *FLAGS,
    ]  # fmt: skip


def two_nodes(
    ckpt: Path, env: dict[str, str], memory: list[Path], kill_at: str | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """One job of 2 nodes, node `n` with the memory directory `memory[n]` (static rendezvous: node `n`
    holds rank `n`), waiting for both to end; once node 0 ends, node 1 is given 60 s, then SIGKILLed (its
    peer gone, it may wait on the rendezvous' store)."""
    port = free_port()
    nodes = [
        subprocess.Popen(
            node_command(ckpt, n, port),
            env={**torchrun_env(env, kill_at), "FTRAIN_MEMORY_DIR": str(memory[n])},
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


def sealed(memory: Path, part: str) -> list[str]:
    """The steps of which `part` (`rank-<r>`, `replica-<r>`) is sealed under a node's memory directory."""
    return sorted(p.parent.parent.name for p in memory.glob(f"ftrain-*/*/step-*/{part}/.complete"))


async def test_a_node_lost_whole_resumes_from_its_peers_replica_bit_identical(
    tmp_path: Path, env: dict[str, str]
) -> None:
    memory = [tmp_path / f"shm-node{n}" for n in range(NODES)]
    for path in memory:
        path.mkdir(mode=0o700)

    ckpt, job = job_env("replica-reference", env, memory[0])
    reference = await asyncio.to_thread(two_nodes, ckpt, job, memory)
    digest = final_digest(reference[0])
    assert [sealed(m, "*") for m in memory] == [[], []], (
        "a completed run's snapshots and replicas are removed"
    )

    # node 0 (rank 0) SIGKILLed once snapshot 35 is recorded and replicated: newer than the durable step 20
    ckpt, job = job_env("replica-kill", env, memory[0])
    killed = await asyncio.to_thread(two_nodes, ckpt, slowed(job), memory, "snapshot:35")
    assert killed[0].returncode == KILLED, killed[0].stderr[-3000:]
    assert sealed(memory[1], "rank-1") == sealed(memory[1], "replica-0") == ["step-35"], "the newest kept"
    assert sealed(memory[0], "replica-1") == ["step-35"]
    shutil.rmtree(memory[0])  # the node lost whole: its memory with it
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
