"""Which nodes the next attempt of `ftrain run` runs on. By default the same ones: a lost node is waited for
(the rendezvous holds the relaunch until it is back). With `--min-nodes M` below `--nodes`, a node the last
attempt lost is dropped instead, as long as M are left: training goes on on fewer nodes, the trainer loads
the checkpoint resharded to the smaller world, and the `resumed` that opens the attempt names its nodes. A
later relaunch takes back the dropped nodes that answer again (`node_return`), in the allocation's order.
Pure; nothing imports torch."""

from ftrain.supervise.node_exec import NodeExit


def next_hosts(hosts: tuple[str, ...], lost: NodeExit | None, min_nodes: int) -> tuple[str, ...]:
    """The next attempt's nodes after one that ran on `hosts` ended with `lost` named first (None: no node)."""
    if lost is None or not lost.lost or lost.host not in hosts:
        return hosts
    left = tuple(host for host in hosts if host != lost.host)
    return left if len(left) >= min_nodes else hosts


def rejoined(allocation: tuple[str, ...], hosts: tuple[str, ...], answered: set[str]) -> tuple[str, ...]:
    """`hosts` with the dropped nodes that `answered` back, each in its place in `allocation` (rank 0's node
    stays the allocation's first that is there)."""
    return tuple(host for host in allocation if host in hosts or host in answered)
