"""Where the newest memory snapshot lives, against a real nats-server: rank 0's `snapshotted` and
`snapshot_replicated` land through the outbox (the snapshot's seq decided against the log, a repeat recorded
nothing, one naming no snapshot of the log set aside), `ftrain status` and its JSON show each node's part and
its replica, and the read model rebuilt from the stream shows the same."""

import asyncio
import json
from typing import Any

from ftrain import settings
from ftrain.domain.lifecycle import ReplicaIntent, SnapshotIntent
from ftrain.events.schema import PartReplicas, SnapshotReplicated, Snapshotted
from ftrain.service import RunService
from ftrain.workers.recorder import Recorder
from tests.support.processes import ftrain_process
from tests.unit.test_outbox_deciding import RUN
from tests.unit.test_outbox_delivery import kinds, launch, node_outbox, run_events
from tests.unit.test_snapshot_replicas import TWO_NODES

FLUSH_S = 30.0
ENDED = (PartReplicas(node=0, landed=2), PartReplicas(node=1, landed=1, dropped=1))
NODE_ROWS = [
    ["0", "gpu-a", "ranks 0-1", "30", "replica on node 1 (gpu-b): landed"],
    ["1", "gpu-b", "ranks 2-3", "50", "replica on node 0 (gpu-a): dropped (1 landed, 1 dropped, 0 failed)"],
]
"""The web view's Memory snapshot rows of `record_snapshot`'s run: node, host, ranks, bytes, replica."""


def snapshot(run_id: str = RUN, step: int = 40) -> Snapshotted:
    return Snapshotted(run_id=run_id, step=step, epoch=0, shards=4, uri="file:///dev/shm/s", attempt=1,
                       checkpoint_hash=f"{step + 1000:064x}", size_bytes=80, parts=TWO_NODES)  # fmt: skip


def exchange_ended(run_id: str = RUN, step: int = 40) -> SnapshotReplicated:
    """As rank 0 hands it over: the snapshot named by its digest, its seq left to the log."""
    return SnapshotReplicated(run_id=run_id, snapshot_seq=0, step=step, checkpoint_hash=f"{step + 1000:064x}",
                              replicas=ENDED, attempt=1)  # fmt: skip


async def record_snapshot(app: RunService, env: dict[str, str], run_id: str = RUN) -> None:
    """A launched run whose rank 0 recorded a two-node snapshot and the end of its replica exchange."""
    await launch(app, run_id)
    with Recorder(run_id, settings.nats(env), rank=0) as recorder:
        recorder.record(SnapshotIntent(snapshotted=snapshot(run_id)))
        recorder.record(ReplicaIntent(snapshot_replicated=exchange_ended(run_id)))
        assert await asyncio.to_thread(recorder.flush, FLUSH_S)


def memory_of(env: dict[str, str]) -> dict[str, Any]:
    shown = ftrain_process(["status", RUN, "--json"], env)
    assert shown.returncode == 0, shown.stderr
    memory: dict[str, Any] = json.loads(shown.stdout)["memory_snapshot"]
    return memory


async def test_the_replicas_land_through_the_outbox_once_and_status_shows_them_per_node(
    app: RunService, env: dict[str, str]
) -> None:
    await record_snapshot(app, env)
    with Recorder(RUN, settings.nats(env), rank=0) as recorder:
        recorder.record(ReplicaIntent(snapshot_replicated=exchange_ended()))  # a retry: already in the log
        recorder.record(ReplicaIntent(snapshot_replicated=exchange_ended(step=50)))  # no such snapshot
        assert await asyncio.to_thread(recorder.flush, FLUSH_S)
    events = await run_events(app)
    assert kinds(events) == ["Launched", "Snapshotted", "SnapshotReplicated"]
    ended = events[2]
    assert isinstance(ended, SnapshotReplicated) and ended.snapshot_seq == events[1].seq == 2
    assert ended.replicas == ENDED and ended.actor is not None and ended.actor.rank == 0
    assert (await app.verify(RUN)).ok
    [set_aside] = node_outbox(env).rejected(RUN)
    assert "no memory snapshot of step 50 at seq 0" in set_aside.reason

    shown = ftrain_process(["status", RUN], env)
    assert shown.returncode == 0, shown.stderr
    memory = [line for line in shown.stdout.splitlines() if line.startswith(("memory", "  node"))]
    assert memory[1:] == [
        "  node 0    gpu-a ranks 0-1, 30 bytes; replica on node 1 (gpu-b): landed",
        "  node 1    gpu-b ranks 2-3, 50 bytes; replica on node 0 (gpu-a): dropped (1 landed, 1 dropped, 0 failed)",
    ]
    before = memory_of(env)
    assert [n["replica"] for n in before["nodes"]] == ["landed", "dropped"]
    listed = ftrain_process(["list", "--json"], env)
    assert json.loads(listed.stdout)[0]["memory_snapshot"] == before

    rebuilt = ftrain_process(["replay", "--rebuild"], env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert memory_of(env) == before
