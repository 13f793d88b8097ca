"""Resume from a peer's replica: the ranks whose own part of the snapshot is not on their node get it back
from the node that holds its replica (`memory_tier.buddy`), on the tier's gloo group, before any rank loads.

Each holder judges the replicas it holds for the ranks that lack their part (the manifest against the log's
digest, every file hashed); only when every missing part has a verified replica is anything sent, so every
rank takes the same way. A rank receiving its part restores it (`memory_tier.restore_part`: the manifest's
bytes checked against the log's digest before they are decoded); the resume then judges it again, as any
part on its node, before a byte of it is loaded.
"""

import structlog
import torch.distributed as dist
from torch.distributed import Work

from ftrain.train.replication import receive_part, send_part
from ftrain.train.snapshots import MemoryTier
from ftrain.workers.layout import MANIFEST
from ftrain.workers.manifest import Manifest
from ftrain.workers.memory_tier import buddy, concatenated, judge, local_entries, replica_dir, restore_part

log = structlog.get_logger(__name__)


def fetch_replicas(
    tier: MemoryTier, step: int, expected: str, run_name: str, missing: list[int], attempt: int
) -> bool:
    """Every rank: each rank of `missing` (the same on every rank) given its part of the snapshot of `step`
    from the replica its buddy holds; whether every one was sent (False: some replica is not there, nothing
    was sent). What a receiving rank wrote is judged by the caller."""
    sends: list[Work] = []
    ready = {
        r: judged
        for r in missing
        if buddy(r, tier.local_world, tier.world) == tier.rank
        and isinstance(judged := judge(tier.root, step, r, expected, run_name, replica=True), Manifest)
    }
    every: list[list[int]] = [[]] * tier.world
    dist.all_gather_object(every, sorted(ready), group=tier.group)
    if sorted(r for held in every for r in held) != missing:
        return False
    for r, manifest in ready.items():
        path = replica_dir(tier.root, step, r)
        files = concatenated(path, local_entries(manifest, r))
        sends += send_part(tier.group, r, (path / MANIFEST).read_bytes(), files)
    if tier.rank in missing:
        holder = buddy(tier.rank, tier.local_world, tier.world)
        assert holder is not None
        refused = restore_part(
            tier.root, step, tier.rank, expected, attempt, *receive_part(tier.group, holder)
        )
        if refused is not None:
            log.warning("memory_replica_refused", step=step, rank=tier.rank, reason=refused)
    for sent in sends:
        sent.wait()
    return True
