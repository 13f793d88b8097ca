"""Where a memory snapshot's parts live and what became of their replicas, as the log records them: one entry
per node (ranks are numbered node by node, `local_world` to a node, as `memory_tier.buddy` assumes), so the
events stay small whatever the ranks per node. Pure: rank 0 builds them from what every rank reported.
"""

from collections.abc import Sequence
from typing import Literal

from msgspec import UNSET, UnsetType

from ftrain.events.schema import HOST_MAX, MAX_SNAPSHOT_PARTS, PartReplicas, SnapshotPart
from ftrain.workers.manifest import Manifest

Outcome = Literal["landed", "dropped", "failed"]
"""What became of the replica a rank holds: verified and sealed, refused against the manifest, never whole."""


def node_count(world: int, local_world: int) -> int:
    return -(-world // local_world)


def snapshot_parts(
    manifest: Manifest, hosts: Sequence[str], local_world: int
) -> tuple[SnapshotPart, ...] | UnsetType:
    """Each node's part of `manifest`'s snapshot (`hosts`: every rank's host name, in rank order); unset on a
    job of more than MAX_SNAPSHOT_PARTS nodes."""
    world = len(hosts)
    nodes = node_count(world, local_world)
    if nodes > MAX_SNAPSHOT_PARTS:
        return UNSET
    sizes = [0] * nodes
    for entry in manifest.files:
        rank = int(entry.name.split("/", 1)[0].removeprefix("rank-"))
        sizes[rank // local_world] += entry.size
    return tuple(
        SnapshotPart(
            node=node,
            host=hosts[node * local_world][:HOST_MAX],
            first_rank=node * local_world,
            ranks=min(local_world, world - node * local_world),
            size_bytes=sizes[node],
            replica_node=(node + 1) % nodes if nodes > 1 else None,
        )
        for node in range(nodes)
    )


def part_replicas(held: Sequence[Outcome], local_world: int) -> tuple[PartReplicas, ...]:
    """Per node, what became of its ranks' replicas, from `held`: in rank order, what each rank made of the
    replica it holds (its source's: the same local rank on the node before)."""
    world = len(held)
    counts = [{"landed": 0, "dropped": 0, "failed": 0} for _ in range(node_count(world, local_world))]
    for holder, outcome in enumerate(held):
        source = (holder - local_world) % world
        counts[source // local_world][outcome] += 1
    return tuple(PartReplicas(node=node, **c) for node, c in enumerate(counts))
