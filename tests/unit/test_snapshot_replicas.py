"""Where the newest memory snapshot lives and whether its replicas landed, through the pure API: the parts
and outcomes rank 0 builds from what every rank reported, the judge and the fold of `snapshot_replicated`,
the outbox's intent deciding it, an old `snapshotted` (no parts) still reading, and what `status`, its JSON
and `replay` show per node."""

import re
from datetime import UTC, datetime

import msgspec
import pytest

from ftrain.cli import render
from ftrain.cli.queries import status_document
from ftrain.domain.lifecycle import IllegalTransition, ReplicaIntent, check, decide_intent
from ftrain.events.schema import (
    MAX_SNAPSHOT_PARTS,
    AnyEvent,
    PartReplicas,
    SnapshotPart,
    SnapshotReplicated,
    Snapshotted,
    decode_event,
    encode_event,
)
from ftrain.workers.integrity import digest_of
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.snapshot_parts import Outcome, part_replicas, snapshot_parts
from tests.support.builders import fold
from tests.unit.test_judge_rules import RUN, launched
from tests.unit.test_memory_tier_rules import FAILED, from_memory

HASH = f"{1040:064x}"
TWO_NODES = (
    SnapshotPart(node=0, host="gpu-a", first_rank=0, ranks=2, size_bytes=30, replica_node=1),
    SnapshotPart(node=1, host="gpu-b", first_rank=2, ranks=2, size_bytes=50, replica_node=0),
)


def snap(step: int = 40, *, parts: tuple[SnapshotPart, ...] | None = TWO_NODES) -> Snapshotted:
    return Snapshotted(run_id=RUN, step=step, epoch=0, shards=4, uri="file:///dev/shm/s", attempt=1,
                       checkpoint_hash=f"{step + 1000:064x}", size_bytes=80,
                       parts=msgspec.UNSET if parts is None else parts)  # fmt: skip


def replicated(*replicas: PartReplicas, seq: int = 2, step: int = 40, attempt: int = 1) -> SnapshotReplicated:
    return SnapshotReplicated(run_id=RUN, snapshot_seq=seq, step=step, checkpoint_hash=f"{step + 1000:064x}",
                              replicas=replicas, attempt=attempt)  # fmt: skip


ALL_LANDED = (PartReplicas(node=0, landed=2), PartReplicas(node=1, landed=2))


def refused(events: tuple[AnyEvent, ...], event: AnyEvent, message: str) -> None:
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
        check(fold(*events), event)


def _manifest(world: int) -> Manifest:
    files = [FileEntry(f"rank-{r}/__0_0.distcp", 10 * (r + 1), digest_of(b"x")) for r in range(world)]
    return Manifest(run_id=RUN, step=40, epoch=0, shards=world, world_size=world, dataset_revision=None,
                    created_at=datetime(2026, 1, 1, tzinfo=UTC), files=tuple(files))  # fmt: skip


def test_each_nodes_part_names_its_ranks_bytes_and_the_next_node_for_its_replica() -> None:
    parts = snapshot_parts(_manifest(4), ["gpu-a", "gpu-a", "gpu-b", "gpu-b"], 2)
    assert parts == (
        SnapshotPart(node=0, host="gpu-a", first_rank=0, ranks=2, size_bytes=30, replica_node=1),
        SnapshotPart(node=1, host="gpu-b", first_rank=2, ranks=2, size_bytes=70, replica_node=0),
    )
    one_node = snapshot_parts(_manifest(2), ["gpu-a", "gpu-a"], 2)
    assert one_node == (SnapshotPart(node=0, host="gpu-a", first_rank=0, ranks=2, size_bytes=30),)


def test_a_job_on_more_nodes_than_the_log_names_records_no_parts() -> None:
    world = MAX_SNAPSHOT_PARTS + 1
    assert snapshot_parts(_manifest(world), ["n"] * world, 1) is msgspec.UNSET


def test_each_outcome_counts_for_the_node_whose_replica_it_is() -> None:
    # rank r holds the replica of rank (r - 2) % 4: rank 1 holds rank 3's (node 1), rank 2 rank 0's (node 0)
    held: list[Outcome] = ["landed", "dropped", "failed", "landed"]
    assert part_replicas(held, 2) == (
        PartReplicas(node=0, landed=1, failed=1),
        PartReplicas(node=1, landed=1, dropped=1),
    )


def test_the_end_of_the_exchange_folds_into_the_newest_snapshot() -> None:
    state = fold(launched(), snap(), replicated(*ALL_LANDED))
    assert state.snapshot is not None and state.snapshot.replicas == ALL_LANDED
    assert [c.replica for c in state.snapshot.nodes()] == ["landed", "landed"]
    newer = fold(launched(), snap(), replicated(*ALL_LANDED), snap(50))
    assert newer.snapshot is not None and newer.snapshot.replicas is None
    assert [c.replica for c in newer.snapshot.nodes()] == ["pending", "pending"]


def test_it_may_follow_a_failure_of_the_attempt_that_took_the_snapshot_but_not_a_later_attempt() -> None:
    state = fold(launched(), snap(), FAILED, replicated(*ALL_LANDED))
    assert state.snapshot is not None and state.snapshot.replicas == ALL_LANDED
    refused(
        (launched(), snap(), FAILED, from_memory(2, 40)),
        replicated(*ALL_LANDED),
        "run r is in attempt 2; an event of attempt 1 is refused",
    )


@pytest.mark.parametrize(
    "forged",
    [replicated(*ALL_LANDED, seq=1), replicated(*ALL_LANDED, seq=0), replicated(*ALL_LANDED, step=41, seq=2)],
)
def test_it_names_the_newest_snapshot_by_seq_step_and_digest(forged: SnapshotReplicated) -> None:
    refused(
        (launched(), snap()),
        forged,
        f"run r has no memory snapshot of step {forged.step} at seq {forged.snapshot_seq} as its newest",
    )


def test_it_is_recorded_once_per_snapshot() -> None:
    refused(
        (launched(), snap(), replicated(*ALL_LANDED)),
        replicated(*ALL_LANDED),
        "the replicas of memory snapshot seq 2 are recorded already",
    )


@pytest.mark.parametrize(
    "replicas",
    [
        (PartReplicas(node=0, landed=2),),
        (*ALL_LANDED, PartReplicas(node=0, landed=2)),
        (PartReplicas(node=0, landed=2), PartReplicas(node=1, landed=1)),
        (PartReplicas(node=0, landed=2), PartReplicas(node=2, landed=2)),
    ],
)
def test_it_names_each_replicated_part_once_its_counts_adding_up(replicas: tuple[PartReplicas, ...]) -> None:
    refused(
        (launched(), snap()),
        replicated(*replicas),
        "snapshot_replicated must name each replicated part of memory snapshot seq 2 once, its counts adding "
        "up to the part's ranks",
    )


def test_a_snapshot_that_named_no_parts_has_no_replicas_to_record() -> None:
    refused(
        (launched(), snap(parts=None)),
        replicated(*ALL_LANDED),
        "snapshot_replicated must name each replicated part of memory snapshot seq 2 once, its counts adding "
        "up to the part's ranks",
    )


def test_the_intent_takes_the_snapshots_seq_from_the_log_and_lands_once() -> None:
    intent = ReplicaIntent(snapshot_replicated=replicated(*ALL_LANDED, seq=0))
    at = datetime(2026, 1, 2, tzinfo=UTC)
    decided = decide_intent(fold(launched(), snap()), intent, "i", at)
    assert isinstance(decided, SnapshotReplicated) and decided.snapshot_seq == 2 and decided.id == "i"
    assert decide_intent(fold(launched(), snap(), replicated(*ALL_LANDED)), intent, "i", at) is None
    unknown = decide_intent(fold(launched(), snap(50)), intent, "i", at)
    assert isinstance(unknown, SnapshotReplicated) and unknown.snapshot_seq == 0  # for the judge to refuse


def test_a_snapshotted_event_written_before_parts_reads_and_shows_no_nodes() -> None:
    old = encode_event(snap(parts=None))
    assert b'"parts"' not in old
    event = decode_event(old)
    assert isinstance(event, Snapshotted) and event.parts is msgspec.UNSET
    state = fold(launched(), event)
    assert state.snapshot is not None and state.snapshot.nodes() == []
    assert render.memory_lines(state.snapshot) == [render.status(state, state.updated_at)[4]]
    doc = status_document(state)["memory_snapshot"]
    assert doc["nodes"] == []


def test_status_shows_each_nodes_part_and_where_its_replica_stands() -> None:
    pending = fold(launched(), snap())
    assert pending.snapshot is not None
    lines = render.memory_lines(pending.snapshot)
    assert lines[1:] == [
        "  node 0    gpu-a ranks 0-1, 30 bytes; replica on node 1 (gpu-b): pending",
        "  node 1    gpu-b ranks 2-3, 50 bytes; replica on node 0 (gpu-a): pending",
    ]
    partial = (PartReplicas(node=0, landed=2), PartReplicas(node=1, landed=1, dropped=1))
    ended = fold(launched(), snap(), replicated(*partial))
    assert ended.snapshot is not None
    assert render.memory_lines(ended.snapshot)[1:] == [
        "  node 0    gpu-a ranks 0-1, 30 bytes; replica on node 1 (gpu-b): landed",
        "  node 1    gpu-b ranks 2-3, 50 bytes; replica on node 0 (gpu-a): dropped (1 landed, 1 dropped, 0 failed)",
    ]
    nodes = status_document(ended)["memory_snapshot"]["nodes"]
    assert nodes[1] == {"node": 1, "host": "gpu-b", "first_rank": 2, "ranks": 2, "size_bytes": 50,
                        "replica_node": 0, "replica_host": "gpu-a", "replica": "dropped", "landed": 1,
                        "dropped": 1, "failed": 0}  # fmt: skip
    assert status_document(pending)["memory_snapshot"]["nodes"][0]["landed"] is None
    one = fold(
        launched(), snap(parts=(SnapshotPart(node=0, host="gpu-a", first_rank=0, ranks=1, size_bytes=9),))
    )
    assert one.snapshot is not None
    assert render.memory_lines(one.snapshot)[1] == "  node 0    gpu-a rank 0, 9 bytes; no replica (one node)"


def test_replay_summarises_the_end_of_the_exchange() -> None:
    said = render.summary(
        replicated(PartReplicas(node=0, landed=2), PartReplicas(node=1, landed=0, failed=2))
    )
    assert said == "step 40 (snapshot seq 2): 2 of 4 replicas landed"
