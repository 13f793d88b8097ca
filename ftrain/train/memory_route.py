"""Which tier can serve a memory snapshot to the world that resumes it: one pure decision, taken alike on every
rank from what every rank found on its node.

A rank resumed on the snapshot's own world size needs one part, its own rank's (its RNG streams, its shards):
found as its own part (`rank-<r>`) or as a replica held on its node (`replica-<r>`: the job came back on fewer
nodes, or with more ranks to a node). A rank of another world size needs every part: DCP's resharding load
reads any saving rank's items. Each rank reports the copies it found on its node of the parts it needs, each
verified against the log's manifest (`Copy.defect`: why one did not match). Then:

- a copy that failed verification skips the snapshot, recorded against its tier (`peer`: a replica, or a part
  sent back from one), and the next tier is tried;
- every rank holding every part it needs: served (`memory`; `peer` once parts were sent back);
- on the same world, ranks lacking their own part: their buddies' replicas may be sent back (`Fetch`), then
  the ranks decide again on what they then hold;
- else the snapshot is unavailable to this world (no defect: nothing recorded), and the durable tier serves.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from ftrain.events.schema import Tier

Kind = Literal["own", "replica"]
KINDS: tuple[Kind, ...] = get_args(Kind)
"""Where a rank looks for a part on its node, in order: its own directory, then a replica."""


@dataclass(frozen=True)
class Copy:
    """A part of the snapshot, saved by rank `source`, as one rank found it on its node: its own directory
    (`rank-<source>`) or a replica (`replica-<source>`), verified (`defect` None) or why not."""

    source: int
    kind: Kind
    defect: str | None = None

    @property
    def directory(self) -> str:
        """The part's directory in the snapshot's, on its node."""
        return f"{'rank' if self.kind == 'own' else 'replica'}-{self.source}"


@dataclass(frozen=True)
class Serve:
    """Every rank loads the parts it needs from its node; `reshard`: through DCP's resharding load."""

    tier: Tier
    reshard: bool


@dataclass(frozen=True)
class Fetch:
    """The ranks of `missing` lack their own part on their node: send it back from their buddies' replicas."""

    missing: tuple[int, ...]


@dataclass(frozen=True)
class Skip:
    """A copy failed verification: the snapshot is refused, recorded against `tier`."""

    reason: str
    tier: Tier


@dataclass(frozen=True)
class Unavailable:
    """A part some rank needs is on none of its node's copies: the durable tier serves, nothing recorded."""

    reason: str


Route = Serve | Fetch | Skip | Unavailable


def needed(rank: int, saved_world: int, world: int) -> range:
    """The saving ranks whose parts `rank` loads: its own on the same world size, every one on another."""
    return range(rank, rank + 1) if saved_world == world else range(saved_world)


def route(saved_world: int, world: int, found: Sequence[Sequence[Copy]], *, fetched: bool = False) -> Route:
    """How the snapshot saved by `saved_world` ranks serves `world` ranks, each of which found `found[rank]`
    on its node (the copies of the parts it needs: `needed`); `fetched`: parts were already sent back from
    replicas. See the module."""
    for copy in (c for copies in found for c in copies):
        if copy.defect is not None:
            return Skip(copy.defect, "peer" if fetched or copy.kind == "replica" else "memory")
    lacking = [
        (rank, source)
        for rank, copies in enumerate(found)
        for source in needed(rank, saved_world, world)
        if all(c.source != source for c in copies)
    ]
    if not lacking:
        return Serve("peer" if fetched else "memory", reshard=saved_world != world)
    if saved_world == world and not fetched:
        return Fetch(tuple(rank for rank, _ in lacking))
    rank, source = lacking[0]
    if saved_world == world:
        return Unavailable(f"rank {rank} has no part of it on its node, nor a replica its buddy could send")
    return Unavailable(
        f"saved by {saved_world} ranks, resumed by {world}: the node of rank {rank} holds no copy of "
        f"rank {source}'s part"
    )
