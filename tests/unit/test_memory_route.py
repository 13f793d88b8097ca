"""Which tier serves a memory snapshot to the world that resumes it (`memory_route.route`), from the copies
each rank found on its node: the same world, the job back on fewer nodes or with more ranks (DCP reshards
from the parts and replicas the nodes hold), a part on no node, and a copy that fails verification."""

from ftrain.train.memory_route import Copy, Fetch, Serve, Skip, Unavailable, needed, route


def own(source: int) -> Copy:
    return Copy(source, "own")


def replica(source: int, defect: str | None = None) -> Copy:
    return Copy(source, "replica", defect)


def test_a_rank_needs_its_own_part_on_the_same_world_and_every_part_on_another() -> None:
    assert list(needed(1, 2, 2)) == [1]
    assert list(needed(0, 2, 1)) == list(needed(3, 2, 4)) == [0, 1]
    assert (own(1).directory, replica(1).directory) == ("rank-1", "replica-1")


def test_the_same_world_each_rank_its_own_part_is_served_from_memory() -> None:
    assert route(2, 2, [[own(0)], [own(1)]]) == Serve("memory", reshard=False)


def test_the_same_world_on_fewer_nodes_loads_a_replica_held_there_without_resharding() -> None:
    # 2 nodes of 1 rank back as 1 node of 2: node 0 held rank 0's part and rank 1's replica
    assert route(2, 2, [[own(0)], [replica(1)]]) == Serve("memory", reshard=False)


def test_fewer_nodes_holding_every_part_and_replica_reshard_from_memory() -> None:
    # 2 nodes of 1 rank back as 1 node of 1 rank
    assert route(2, 1, [[own(0), replica(1)]]) == Serve("memory", reshard=True)


def test_more_ranks_reshard_where_each_node_holds_every_part() -> None:
    # 2 nodes of 1 rank back as 2 nodes of 2: node 0 holds rank-0 and replica-1, node 1 rank-1 and replica-0
    node0, node1 = [own(0), replica(1)], [replica(0), own(1)]
    assert route(2, 4, [node0, node0, node1, node1]) == Serve("memory", reshard=True)


def test_more_ranks_where_a_node_lacks_a_part_fall_back_to_durable() -> None:
    # 4 ranks on 4 nodes back as 8 on 4: a node holds 2 of the 4 parts
    decided = route(4, 8, [[own(0), replica(3)]] * 8)
    assert decided == Unavailable(
        "saved by 4 ranks, resumed by 8: the node of rank 0 holds no copy of rank 1's part"
    )


def test_a_part_missing_on_its_node_is_fetched_from_its_buddy_on_the_same_world() -> None:
    assert route(2, 2, [[], [own(1)]]) == Fetch((0,))
    assert route(2, 2, [[own(0)], [own(1)]], fetched=True) == Serve("peer", reshard=False)


def test_a_part_missing_everywhere_is_unavailable_never_corrupt() -> None:
    assert route(2, 2, [[], [own(1)]], fetched=True) == Unavailable(
        "rank 0 has no part of it on its node, nor a replica its buddy could send"
    )
    assert route(2, 1, [[own(0)]]) == Unavailable(
        "saved by 2 ranks, resumed by 1: the node of rank 0 holds no copy of rank 1's part"
    )


def test_a_replica_that_fails_verification_is_skipped_against_the_peer_tier() -> None:
    bad = replica(1, "file __0_0.distcp hash mismatch")
    assert route(2, 1, [[own(0), bad]]) == Skip("file __0_0.distcp hash mismatch", "peer")
    assert route(2, 2, [[own(0)], [bad]]) == Skip("file __0_0.distcp hash mismatch", "peer")


def test_an_own_part_that_fails_verification_is_skipped_against_memory_or_peer_once_sent_back() -> None:
    bad = Copy(1, "own", "manifest digest mismatch")
    assert route(2, 2, [[own(0)], [bad]]) == Skip("manifest digest mismatch", "memory")
    assert route(2, 2, [[own(0)], [bad]], fetched=True) == Skip("manifest digest mismatch", "peer")
    assert route(2, 2, [[], [bad]]) == Skip("manifest digest mismatch", "memory"), "a defect before a fetch"
